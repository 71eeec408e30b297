"""Every option of the sink (``df.write[Stream].format("kinesis-ddb")``), declared once.

The connection options (region, endpoint, retries, credentials) are the source's, inherited
from :class:`~kinesis_source.aws.options.ConnectionOptions`. ``docs/sink.md``'s options table
is generated from these declarations (``python -m kinesis_source.sink.options``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kinesis_source.aws.options import ConnectionOptions
from kinesis_source.errors import OptionError
from kinesis_source.option_decl import markdown_table, option, parse_options
from kinesis_source.option_values import (
    byte_rate_in,
    int_in,
    parse_bool,
    parse_callback_path,
    parse_stream_arns,
    parse_stream_names,
)

MIB = 1024 * 1024
SHARD_WRITE_BYTES_PER_S = MIB  # Kinesis' write quota per shard, every writer together
SHARD_WRITE_RECORDS_PER_S = 1000
KPL_AGGREGATE_BYTES = 51200  # the KPL's default AggregationMaxSize


def _one_stream_name(text: str) -> str:
    names = parse_stream_names(text)
    if len(names) != 1:
        raise ValueError("must name one stream: a write goes to one stream")
    return names[0]


def _one_stream_arn(text: str) -> str:
    arns = parse_stream_arns(text)
    if len(arns) != 1:
        raise ValueError("must be one stream ARN: a write goes to one stream")
    return arns[0]


@dataclass(frozen=True)
class SinkOptions(ConnectionOptions):
    """The parsed options of one write. Secrets are left out of ``repr``."""

    stream_name: str | None = option(
        "streamName",
        "string",
        None,
        "Kinesis stream to write. Required, unless `streamARN` names it.",
        _one_stream_name,
    )
    stream_arn: str | None = option(
        "streamARN",
        "string",
        None,
        "The stream to write by ARN (`arn:aws:kinesis:<region>:<account>:stream/<name>`) instead "
        "of `streamName`, as a stream shared from another account needs; `region` defaults to "
        "the ARN's region.",
        _one_stream_arn,
    )
    preserve_key_order: bool = option(
        "preserveKeyOrder",
        "boolean",
        True,
        "`true`: a `PutRecords` request carries at most one record of each partition key (with "
        "`aggregate`, one aggregated record per shard), so a record Kinesis refuses is retried "
        "before the next record of its key is sent, and each key's records keep the order of "
        "the task's rows across partial failures. `false`: requests are filled in row order, "
        "faster when few keys carry many records, but a retried record may land after later "
        "records of its key. See docs/sink.md.",
        parse_bool,
    )
    aggregate: bool = option(
        "aggregate",
        "boolean",
        False,
        "Pack rows into KPL aggregated records (one Kinesis record holds many rows of one "
        "shard), which KCL, aws-kinesis-agg and this source's reader expand. Cuts records/s "
        "against the shard's 1,000 records/s quota; readers that do not de-aggregate see the "
        "aggregates' bytes.",
        parse_bool,
    )
    aggregation_max_bytes: int = option(
        "aggregationMaxBytes",
        "int",
        KPL_AGGREGATE_BYTES,
        "Largest aggregated record, in bytes (the KPL's `AggregationMaxSize`); a row larger "
        "than this is written as a record of its own. At most 1 MiB (Kinesis' record limit).",
        int_in(256, MIB),
    )
    max_write_rate_per_shard: float = option(
        "maxWriteRatePerShard",
        "bytes/s",
        SHARD_WRITE_BYTES_PER_S,  # (the parser gives a float; a whole number shows better)
        "Most bytes a second one task writes into one shard (data and partition key, as "
        "Kinesis counts them; e.g. `512KiB`, `1MiB`). Kinesis allows 1 MiB/s per shard, every "
        "writer together: when several tasks or applications write the same shards, an answer "
        "refusing records slows this task's rate for that shard, which recovers while none is "
        "refused. "
        "See docs/sink.md.",
        byte_rate_in(0, MIB),
    )
    max_records_per_second_per_shard: int = option(
        "maxRecordsPerSecondPerShard",
        "int",
        SHARD_WRITE_RECORDS_PER_S,
        "Most Kinesis records a second one task writes into one shard (Kinesis allows 1,000 "
        "per shard, every writer together).",
        int_in(1, SHARD_WRITE_RECORDS_PER_S),
    )
    max_records_per_request: int = option(
        "maxRecordsPerRequest",
        "int",
        500,
        "Most records in one `PutRecords` request (Kinesis allows 500 and 5 MiB).",
        int_in(1, 500),
    )
    max_record_retries: int = option(
        "maxRecordRetries",
        "int",
        20,
        "How many times a record that Kinesis refused inside a `PutRecords` answer (throttled, "
        "internal failure) is sent again before the task fails, naming the stream, how many "
        "records were refused and why. Throttled records wait for the shard's write budget, "
        "not a fixed backoff.",
        int_in(0, 1000),
    )

    on_write: str | None = option(
        "onWrite",
        "string",
        None,
        "Callback `package.module:function` called with a `WriteInfo` (stream, batch id, rows, "
        "Kinesis records, bytes, requests, records refused by error code) after each batch write "
        "or micro-batch has written all its rows, in Spark's driver-side Python process (it must "
        "be importable there). If it raises, the write fails; its rows stay written.",
        parse_callback_path,
    )

    def __post_init__(self) -> None:
        if self.stream_arn is None:
            if not self.stream_name:
                raise OptionError(
                    "Option 'streamName' is required (or 'streamARN'): the Kinesis stream to write"
                )
        else:
            if self.stream_name:
                raise OptionError(
                    "Options 'streamName' and 'streamARN' exclude each other: name the stream one way"
                )
            from kinesis_source.aws.streams import StreamArn

            arn = StreamArn.parse(self.stream_arn)
            if self.region is not None and self.region != arn.region:
                raise OptionError(
                    f"Option 'region' = {self.region!r} differs from the region of the stream in "
                    f"'streamARN' ({arn.region}): leave 'region' out, or give the stream's region"
                )
            object.__setattr__(self, "stream_name", arn.name)  # derived: frozen
            object.__setattr__(self, "region", arn.region)
        super().__post_init__()

    @property
    def stream(self) -> str:
        """The stream's name."""
        assert self.stream_name is not None  # __post_init__ made sure
        return self.stream_name

    @property
    def stream_arn_map(self) -> dict[str, str]:
        """Stream name -> ARN when the stream was given by ARN (the clients then name it so)."""
        return {self.stream: self.stream_arn} if self.stream_arn else {}

    @staticmethod
    def parse(raw: Mapping[str, str]) -> SinkOptions:
        """Validate Spark's option map (keys case-insensitive) into a frozen object."""
        from kinesis_source.options import SourceOptions, _only_in

        return parse_options(SinkOptions, raw, "writing", _only_in(SourceOptions, SinkOptions))


def options_markdown() -> str:
    """The sink's options table (the block of ``docs/sink.md`` between its markers)."""
    return "\n".join(markdown_table(SinkOptions)) + "\n"


if __name__ == "__main__":
    print(options_markdown(), end="")
