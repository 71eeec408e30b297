"""What crosses the pickling boundary to an executor: one exact range and how to read it."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from kinesis_source.aws.clients import AwsSettings
from kinesis_source.options import SourceOptions
from kinesis_source.positions import ShardRange
from kinesis_source.tip_reports import ReportAddress


@dataclass(frozen=True, repr=False)
class RangePartition(InputPartition):
    """One exact shard range plus what an executor needs to read it; immutable, so a retried
    task reads exactly what was planned."""

    range: ShardRange
    settings: AwsSettings
    page_limit: int
    on_corrupt: str
    fail_on_data_loss: bool
    consumer_arn: str | None = None  # set: read by enhanced fan-out subscription
    # the shard's hash keys: user records of KPL aggregates outside are dropped (None: keep all)
    hash_range: tuple[int, int] | None = None
    # (iterator, first sequence number): an iterator the driver's probe read from at the
    # range's start, and the record it found first there; used if that record comes first again
    opener: tuple[str, str | None] | None = None
    page_interval_s: float = 0.0  # least time between two GetRecords of this shard (the budget)
    not_before: float = 0.0  # epoch seconds: the driver booked the first call for then
    report_to: ReportAddress | None = None  # the driver's listener for what the read saw past the end

    @staticmethod
    def of(
        rng: ShardRange,
        settings: AwsSettings,
        opts: SourceOptions,
        consumer_arn: str | None = None,
        hash_range: tuple[int, int] | None = None,
        opener: tuple[str, str | None] | None = None,
        not_before: float = 0.0,
        report_to: ReportAddress | None = None,
    ) -> RangePartition:
        """The partition of ``rng`` under the query's options."""
        return RangePartition(
            rng,
            settings,
            opts.max_records_per_fetch,
            opts.on_corrupt_aggregate,
            opts.fail_on_data_loss,
            consumer_arn,
            hash_range,
            opener,
            # executors get half of the shard's GetRecords budget (the driver's probes the rest)
            2.0 / opts.get_records_per_shard_per_second,
            not_before,
            report_to,
        )

    def __repr__(self) -> str:
        # A generated repr would list the settings, which hold secrets.
        return f"RangePartition({self.range})"
