"""What crosses the pickling boundary to an executor: a task's exact ranges and how to read them."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from kinesis_source.aws.clients import AwsSettings
from kinesis_source.options import SourceOptions
from kinesis_source.positions import ShardRange
from kinesis_source.read_rate import RateState
from kinesis_source.tip_reports import ReportAddress


@dataclass(frozen=True, repr=False)
class ShardRead:
    """One exact shard range of a task and what planning found for reading it."""

    range: ShardRange
    consumer_arn: str | None = None  # set: read by enhanced fan-out subscription
    # the shard's hash keys: user records of KPL aggregates outside are dropped (None: keep all)
    hash_range: tuple[int, int] | None = None
    # (iterator, first sequence number): an iterator the driver's probe read from at the
    # range's start, and the record it found first there; used if that record comes first again
    opener: tuple[str, str | None] | None = None
    not_before: float = 0.0  # epoch seconds: the driver booked the first call for then
    records: int | None = None  # how many records the range holds, when the driver knows
    rate: RateState | None = None  # the shard's byte model as the driver hands it on
    end_at: float | None = None  # when the range's end record arrived (epoch s), if its size is unknown
    # the range's first records (all of them, or up to where ``opener`` reads on), which the
    # driver already read: the executor reads none of them again
    carried: tuple[dict, ...] = ()
    # epoch seconds: when the shard's call budget has room for the read's second GetRecords,
    # given the driver's probes before it (None: the read's share's spacing after the first)
    second_at: float | None = None

    def __repr__(self) -> str:
        # The opener's iterator is a credential-like token for the shard: kept out of logs.
        return f"ShardRead({self.range})"


@dataclass(frozen=True, repr=False)
class RangePartition(InputPartition):
    """One task's exact shard ranges (one or more shards, each read in order) plus what an
    executor needs to read them; immutable, so a retried task reads exactly what was planned."""

    reads: tuple[ShardRead, ...]
    settings: AwsSettings
    page_limit: int
    on_corrupt: str
    fail_on_data_loss: bool
    page_interval_s: float = 0.0  # least time between two GetRecords of one shard (the budget)
    report_to: ReportAddress | None = None  # the driver's listener for what the reads saw past the ends
    max_rate: float | None = None  # maxReadRatePerShard
    # pages after a read's second: the shard's whole GetRecords budget (the driver holds its
    # probes of shards being read while executors report to it); None without reports
    held_interval_s: float | None = None
    watch_tips: bool = False  # fan-out: a subscription goes on after its range as a tip watch

    @staticmethod
    def of(
        reads: ShardRange | ShardRead | tuple[ShardRead, ...],
        settings: AwsSettings,
        opts: SourceOptions,
        report_to: ReportAddress | None = None,
    ) -> RangePartition:
        """The partition reading ``reads`` (a bare range: one shard, nothing planned for it)
        under the query's options."""
        if isinstance(reads, ShardRange):
            reads = ShardRead(reads)
        if isinstance(reads, ShardRead):
            reads = (reads,)
        return RangePartition(
            reads,
            settings,
            opts.max_records_per_fetch,
            opts.on_corrupt_aggregate,
            opts.fail_on_data_loss,
            opts.executor_page_interval_s,
            report_to,
            opts.max_read_rate_per_shard,
            1.0 / opts.get_records_per_shard_per_second if report_to is not None else None,
            # (a subscription the driver holds reports the tips itself)
            opts.efo_tip_watch and opts.consumer_mode == "efo" and not opts.holds_subscriptions
            and report_to is not None,
        )

    @property
    def ranges(self) -> list[ShardRange]:
        """The task's ranges, in the order planned."""
        return [read.range for read in self.reads]

    def __repr__(self) -> str:
        # A generated repr would list the settings, which hold secrets.
        return f"RangePartition({', '.join(str(r) for r in self.ranges)})"
