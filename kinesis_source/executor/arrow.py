"""The output schema and the conversion of Kinesis records to Arrow batches."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kinesis_source import kpl
from kinesis_source.positions import AFTER, ShardRange

SCHEMA_DDL = (
    "data binary, streamName string, shardId string, partitionKey string, "
    "sequenceNumber string, subSequenceNumber long, approximateArrivalTimestamp timestamp"
)

# Spark checks the first batch against the schema exactly: same order, microseconds in UTC.
ARROW_SCHEMA = pa.schema(
    [
        pa.field("data", pa.binary()),
        pa.field("streamName", pa.string()),
        pa.field("shardId", pa.string()),
        pa.field("partitionKey", pa.string()),
        pa.field("sequenceNumber", pa.string()),
        pa.field("subSequenceNumber", pa.int64()),
        pa.field("approximateArrivalTimestamp", pa.timestamp("us", tz="UTC")),
    ]
)


def _micros(ts: Any) -> int | None:
    if ts is None:
        return None
    if isinstance(ts, datetime):
        return round(ts.timestamp() * 1_000_000)
    return round(float(ts) * 1_000_000)


def to_record_batch(stream: str, shard_id: str, records: Sequence[dict]) -> pa.RecordBatch:
    """One Arrow batch from ``GetRecords`` records (already cut to the range), in order.

    Records are plain Kinesis records (``subSequenceNumber`` 0) unless a de-aggregator set
    ``SubSequenceNumber``.
    """
    n = len(records)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([r["Data"] for r in records], pa.binary()),
            pa.array([stream] * n, pa.string()),
            pa.array([shard_id] * n, pa.string()),
            # None for records written without one (streams with the AUTO distribution strategy)
            pa.array([r.get("PartitionKey") for r in records], pa.string()),
            pa.array([r["SequenceNumber"] for r in records], pa.string()),
            pa.array([r.get("SubSequenceNumber", 0) for r in records], pa.int64()),
            _arrivals([r.get("ApproximateArrivalTimestamp") for r in records]),
        ],
        schema=ARROW_SCHEMA,
    )


def _arrivals(stamps: list[Any]) -> pa.Array:
    """Arrival times (epoch seconds, as the Kinesis clients parse them) as microseconds,
    computed by Arrow (a Python round per record was a third of the batch's cost); a record
    parsed elsewhere may carry a datetime, which takes the per-record way."""
    try:
        seconds = pa.array(stamps, pa.float64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        micros = pa.array([_micros(ts) for ts in stamps], pa.int64())
    else:
        micros = pc.cast(pc.round(pc.multiply(seconds, 1_000_000)), pa.int64())  # (round: half to even, as round())
    return micros.cast(pa.timestamp("us", tz="UTC"))


def user_records(
    records: Sequence[dict],
    rng: ShardRange,
    on_corrupt: str,
    hash_range: tuple[int, int] | None = None,
) -> list[dict]:
    """The user records of a page of ``rng``: aggregates expanded; when the range starts inside
    an aggregate (``AFTER:<seq>:<sub>``), the user records up to ``sub`` are dropped.

    ``hash_range`` is the shard's (first, last) hash key: user records of aggregates outside it
    are dropped (see :func:`kpl.expand`); None when the shard's range is unknown.
    """
    out, _ = kpl.expand(records, str(rng.shard), on_corrupt, hash_range)
    start = rng.start
    if start.kind == AFTER and start.sub_seq is not None:
        out = [
            r
            for r in out
            if r["SequenceNumber"] != start.seq or r.get("SubSequenceNumber", 0) > start.sub_seq
        ]
    return out
