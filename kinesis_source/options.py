"""Every option of the source, declared once.

Each option is one field of :class:`SourceOptions` (declared as :mod:`kinesis_source.option_decl`
describes; the connection options are inherited from
:class:`~kinesis_source.aws.options.ConnectionOptions`, shared with the sink). The docs table
(``docs/options.md``) is generated from these declarations (:func:`options_markdown`), and a test
keeps the file in step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from kinesis_source.aws.options import ConnectionOptions
from kinesis_source.errors import OptionError
from kinesis_source.option_decl import markdown_table, option, parse_options, specs_of
from kinesis_source.option_values import (
    InitialPosition,
    byte_rate_in,
    float_in,
    int_in,
    one_of,
    parse_app_name,
    parse_bool,
    parse_callback_path,
    parse_host,
    parse_initial_position,
    parse_non_empty,
    parse_stream_arns,
    parse_stream_names,
    parse_table_name,
    parse_url,
)


@dataclass(frozen=True)
class SourceOptions(ConnectionOptions):
    """The parsed options of one query. Secrets are left out of ``repr``."""

    stream_names: tuple[str, ...] = option(
        "streamName",
        "string",
        None,
        "Kinesis stream to read, or several, comma-separated (offsets, checkpoints and the "
        "`streamName` column keep them apart). Required, unless `streamARN` names the streams.",
        parse_stream_names,
    )
    stream_arns: tuple[str, ...] | None = option(
        "streamARN",
        "string",
        None,
        "The streams to read by ARN instead of `streamName` (comma-separated "
        "`arn:aws:kinesis:<region>:<account>:stream/<name>`): every call then names them by "
        "ARN, as a stream shared from another account needs. The name in the ARN keys offsets "
        "and checkpoints and fills the `streamName` column; `region` defaults to the ARNs' "
        "region.",
        parse_stream_arns,
    )
    initial_position: InitialPosition = option(
        "initialPosition",
        "string",
        InitialPosition("TRIM_HORIZON"),
        "Where a query with no checkpoint starts: `TRIM_HORIZON`, `LATEST`, "
        '`AT_TIMESTAMP:<ISO-8601>` or JSON `{"<shardId>": "<sequenceNumber>"}` (reading starts '
        "after each named sequence number; values may also be `TRIM_HORIZON`, `LATEST`, "
        "`AT_TIMESTAMP:<iso>`; shards not named start at `TRIM_HORIZON`, except those with a "
        "descendant named at a sequence number or `SHARD_END`: they were read to their end, as "
        "in what `checkpoints export` writes). LATEST and AT_TIMESTAMP are resolved once per "
        "query.",
        parse_initial_position,
    )
    max_records_per_fetch: int = option(
        "maxRecordsPerFetch",
        "int",
        10000,
        "`Limit` of each `GetRecords` call (1..10000).",
        int_in(1, 10000),
    )
    max_records_per_batch: int | None = option(
        "maxRecordsPerBatch",
        "int",
        None,
        "Most records (user records, after KPL de-aggregation) in one micro-batch, shared "
        "fairly among the shards with data. Default: no limit. The driver then reads the "
        "batch's records to find where it ends, so use it to catch up a backlog in bounded "
        "batches. A single Kinesis record holding more user records than the limit forms a "
        "batch of its own (records are never split). `Trigger.AvailableNow` honours it; "
        "`Trigger.Once` reads everything, as in Spark's other sources.",
        int_in(1),
    )
    min_probe_interval_ms: int = option(
        "minProbeIntervalMs",
        "int",
        1000,
        "Least time between two tail probes of one shard that has new records (the driver "
        "probes in the background; batches take the newest tips found). Lower means fresher "
        "batch ends, within `getRecordsPerShardPerSecond`.",
        int_in(0),
    )
    max_idle_probe_interval_ms: int = option(
        "maxIdleProbeIntervalMs",
        "int",
        10000,
        "Longest time between two probes of a shard where nothing arrives: the interval doubles "
        "from `minProbeIntervalMs` up to this while the shard stays idle (6 `GetRecords` a "
        "minute per idle shard by default), and is back to the minimum once records arrive. "
        "Bounds how late the first record after a quiet spell is seen.",
        int_in(0),
    )
    get_records_per_shard_per_second: float = option(
        "getRecordsPerShardPerSecond",
        "float",
        2.0,
        "Most `GetRecords` calls this query makes per shard and second, driver probes and "
        "executor reads together (Kinesis allows 5, shared by every application reading the "
        "shard: the default leaves 3 to the others). Half of it is kept for executor reads, "
        "except on shards whose ranges the driver carries whole (it read their records already) "
        "and on shards no read was booked on yet (nothing waits for it). "
        "See docs/operations.md for the arithmetic.",
        float_in(0, 5),
    )
    get_shard_iterator_per_shard_per_second: float = option(
        "getShardIteratorPerShardPerSecond",
        "float",
        1.0,
        "Most `GetShardIterator` calls this query makes per shard and second, driver and "
        "executors together (Kinesis allows 5 per shard). In steady state executors read on "
        "with the iterator the driver's probe left at the batch start and make none.",
        float_in(0, 5),
    )
    max_read_rate_per_shard: float | None = option(
        "maxReadRatePerShard",
        "bytes/s",
        None,
        "Most bytes a second this query reads from one shard, driver and executors together "
        "(e.g. `512KiB`, `0.5MiB`, `1MB`, or a number of bytes). Default: no cap of its own: "
        "reads are paced to the shard's 2 MiB/s and 10 MiB burst, less what other applications "
        "were found to read (a refused call teaches it). Set it to leave a known share to "
        "other applications, or to spread a catch-up over time. See docs/operations.md.",
        byte_rate_in(0, 2 * 1024 * 1024),
    )
    tip_reports: bool = option(
        "tipReports",
        "bool",
        True,
        "Executors report what they read past their ranges' ends to the driver (one TCP message "
        "per task to a listener in the driver's helper, with a per-run token): the driver then "
        "does not probe shards that batches are reading. Reports only spare probes: one that "
        "cannot be delivered costs a probe, never a record.",
        parse_bool,
    )
    tip_report_host: str | None = option(
        "tipReportHost",
        "string",
        None,
        "Address the driver's report listener binds to and executors connect to (default: the "
        "address Spark gives the driver: SPARK_LOCAL_IP, else the host name's address unless it "
        "is loopback, else the first non-loopback interface address). Set it to "
        "spark.driver.host where executors reach the driver under another address; progress "
        "counts reads whose report never came (tipReportsMissing).",
        parse_host,
    )
    shards_per_task: int | None = option(
        "shardsPerTask",
        "int",
        None,
        "Shards one Spark task reads (each shard's records in order; a task reads up to 16 of "
        "its shards at once). Default: as few as keep a batch within the cluster's parallelism "
        "in tasks, one wave (`defaultParallelism`, taken by `register(spark)`; else the "
        "driver's CPU count), so 1 while shards are fewer. Set it when executors come and go, "
        "or to trade task overhead against spreading reads over more executors.",
        int_in(1),
    )
    shard_discovery_interval_ms: int = option(
        "shardDiscoveryIntervalMs",
        "int",
        30000,
        "Least time between two `ListShards` scans for new shards.",
        int_in(0),
    )
    on_corrupt_aggregate: str = option(
        "onCorruptAggregate",
        "string",
        "fail",
        "A KPL aggregate (the aggregation magic and the MD5 of its body both match) whose body "
        "does not decode: `fail` fails the query naming shard and sequence number; `skip` "
        "drops it with a warning in the executor log. A record that starts with the magic "
        "without the matching MD5 is no aggregate: it is delivered as a plain record, as KCL "
        "does.",
        one_of("fail", "skip"),
    )
    consumer_mode: str = option(
        "consumerMode",
        "string",
        "polling",
        "`polling` reads with `GetRecords` (shares the shard's 2 MB/s with other readers); "
        "`efo` reads with enhanced fan-out `SubscribeToShard` through a registered consumer "
        "(its own 2 MB/s per shard, pushed; costs extra): see `efoSubscriptions`.",
        one_of("polling", "efo"),
    )
    efo_subscriptions: str = option(
        "efoSubscriptions",
        "string",
        "query",
        "With `consumerMode=efo`: `query` keeps one subscription per shard in the driver for "
        "the query's life (renewed when Kinesis ends it), and hands each batch's range its "
        "records in the task, so each record is received once and a batch follows the records "
        "within milliseconds; a range the driver does not hold (a batch replayed after a "
        "restart) is read by its executor. `range` subscribes once per batch's range on the "
        "executor: Kinesis refuses a shard's subscription within 5 s of the last, so a shard "
        "joins a batch at most every 5 s. See docs/architecture.md.",
        one_of("query", "range"),
    )
    consumer_name: str | None = option(
        "consumerName",
        "string",
        None,
        "EFO consumer name (with `consumerMode=efo`), registered on each stream if missing and "
        "waited for until ACTIVE. Default: `applicationName`.",
        parse_app_name,
    )
    consumer_timeout_ms: int = option(
        "consumerTimeoutMs",
        "int",
        120000,
        "How long to wait for an EFO consumer to become ACTIVE (registering takes seconds).",
        int_in(1000),
    )
    subscribe_timeout_ms: int = option(
        "subscribeTimeoutMs",
        "int",
        30000,
        "Longest an EFO subscription may stay silent (Kinesis sends an event every few seconds "
        "even when no record arrives) before it is dropped and renewed after the last record "
        "read (the AWS connector's `kinesis.subscribeToShard.timeoutSec`). Lower finds a stalled "
        "subscription sooner.",
        int_in(5000),
    )
    efo_tip_watch: bool = option(
        "efoTipWatch",
        "bool",
        True,
        "With `consumerMode=efo`, `efoSubscriptions=range` (and `tipReports`): a read's "
        "subscription goes on after its "
        "range and reports each new record's sequence number to the driver, so the driver "
        "learns the shards' tips without `GetRecords` (whose 5 calls/s per shard every polling "
        "application of the stream shares). The records that arrive between two batches, about "
        "all of them, are then received twice: EFO data retrieval (billed per GB) about doubles. "
        "false: the driver probes with `GetRecords`. See docs/operations.md.",
        parse_bool,
    )
    deregister_consumer: bool = option(
        "deregisterConsumer",
        "bool",
        False,
        "Deregister the EFO consumer when the query stops (Spark ends the source's planner "
        "process with SIGTERM, which kinesis-ddb handles), unless another run is recorded as "
        "using it in the checkpoint table (a newer run of the application, or another "
        "application with the same `consumerName`). `kinesis-ddb consumers deregister` does it "
        "by hand, e.g. after a crash.",
        parse_bool,
    )
    application_name: str = option(
        "applicationName",
        "string",
        None,
        "Names this application's rows in the checkpoint table (like a KCL application name). "
        "Required. Two queries with one name fence each other: the newer one wins.",
        parse_app_name,
        required=True,
    )
    checkpoint_table: str = option(
        "checkpointTable",
        "string",
        "kinesis_ddb_checkpoints",
        "DynamoDB table of the committed positions (partition key `app`, sort key `key`).",
        parse_table_name,
    )
    create_table: bool = option(
        "createTable",
        "bool",
        True,
        "Create the checkpoint table (on-demand billing) when it is missing and wait until it "
        "is ACTIVE; `false` makes a missing table an error.",
        parse_bool,
    )
    dynamodb_endpoint_url: str | None = option(
        "dynamodbEndpointUrl",
        "string",
        None,
        "DynamoDB endpoint URL, for VPC endpoints and local servers. Default: the region's.",
        parse_url,
    )
    dynamodb_region: str | None = option(
        "dynamodbRegion",
        "string",
        None,
        "Region of the checkpoint table. Default: `region`.",
        parse_non_empty,
    )
    checkpoint_interval_ms: int = option(
        "checkpointIntervalMs",
        "int",
        0,
        "Least time between two commits to DynamoDB; `0` commits every batch. Batches finished "
        "in between are committed together by the next commit or the next trigger that finds no "
        "new records, so "
        "a restart without Spark's checkpoint reads again at most this long of records plus the "
        "batch in flight. Each commit costs write units by the shards that moved (see "
        "docs/operations.md, \"What a query costs\").",
        int_in(0),
    )
    on_commit: str | None = option(
        "onCommit",
        "string",
        None,
        "Callback `package.module:function` called with a `CommitInfo` after every DynamoDB "
        "commit, in the driver-side Python helper process (it must be importable there).",
        parse_callback_path,
    )
    on_commit_errors: str = option(
        "onCommitErrors",
        "string",
        "fail",
        "What a raising commit callback does: `fail` fails the query with its traceback; "
        "`log` logs it and goes on.",
        one_of("fail", "log"),
    )
    fail_on_data_loss: bool = option(
        "failOnDataLoss",
        "bool",
        True,
        "When a shard's position is older than the stream's retention (its records were "
        "trimmed), or a tracked shard or stream is gone: `true` fails the query naming the "
        "stream, shard and position; `false` logs a warning and goes on from the oldest record "
        "left (TRIM_HORIZON).",
        parse_bool,
    )


    def __post_init__(self) -> None:
        self._streams_from_arns()
        super().__post_init__()
        if self.consumer_mode != "efo" and (self.consumer_name or self.deregister_consumer):
            raise OptionError(
                "Options 'consumerName' and 'deregisterConsumer' need consumerMode=efo"
            )

    def _streams_from_arns(self) -> None:
        """``streamName`` or ``streamARN``: the names (and, by default, the region) from the ARNs."""
        if self.stream_arns is None:
            if not self.stream_names:
                raise OptionError("Option 'streamName' is required (or 'streamARN'): the Kinesis stream(s) to read")
            return
        if self.stream_names:
            raise OptionError(
                "Options 'streamName' and 'streamARN' exclude each other: name the streams one way"
            )
        from kinesis_source.aws.streams import StreamArn

        arns = [StreamArn.parse(a) for a in self.stream_arns]
        region = arns[0].region
        if self.region is not None and self.region != region:
            raise OptionError(
                f"Option 'region' = {self.region!r} differs from the region of the streams in "
                f"'streamARN' ({region}): leave 'region' out, or give the streams' region"
            )
        object.__setattr__(self, "stream_names", tuple(a.name for a in arns))  # derived: frozen
        object.__setattr__(self, "region", region)

    @property
    def stream_arn_map(self) -> dict[str, str]:
        """Stream name -> ARN, for the streams given by ARN."""
        # the names were taken from the ARNs, in their order
        return dict(zip(self.stream_names, self.stream_arns, strict=True)) if self.stream_arns else {}

    @property
    def holds_subscriptions(self) -> bool:
        """Fan-out with the driver holding each shard's subscription (``driver/feeds.py``)."""
        return self.consumer_mode == "efo" and self.efo_subscriptions == "query"

    @property
    def executor_page_interval_s(self) -> float:
        """Least time between two ``GetRecords`` of one executor read: half of
        ``getRecordsPerShardPerSecond`` (the driver's probes get the other half)."""
        return 2.0 / self.get_records_per_shard_per_second

    @staticmethod
    def parse(raw: Mapping[str, str]) -> SourceOptions:
        """Validate Spark's option map (keys case-insensitive) into a frozen object."""
        from kinesis_source.sink.options import SinkOptions

        return parse_options(SourceOptions, raw, "reading", _only_in(SinkOptions, SourceOptions))


def _only_in(cls: type, other: type) -> dict[str, str]:
    """Keys (lower case -> key) of ``cls``'s options that ``other`` does not have."""
    theirs = {f.metadata["key"].lower() for f in fields(other)}
    return {
        f.metadata["key"].lower(): f.metadata["key"]
        for f in fields(cls)
        if f.metadata["key"].lower() not in theirs
    }


def option_specs() -> list[dict[str, Any]]:
    """The source's declarations, in table order, as plain dicts (key, type, default, doc,
    required)."""
    return specs_of(SourceOptions)


def options_markdown() -> str:
    """The options table for ``docs/options.md``, generated from the declarations."""
    lines = [
        "# Options",
        "",
        "<!-- Generated from kinesis_source/options.py by `python -m kinesis_source.options`;"
        " do not edit by hand. -->",
        "",
        "Options for reading. Keys are case-insensitive. A bad value fails the query with an "
        "error that names the option, the value and the rule; secrets are never shown. Writing "
        "has its own table in [sink.md](sink.md).",
        "",
        *markdown_table(SourceOptions),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(options_markdown(), end="")
