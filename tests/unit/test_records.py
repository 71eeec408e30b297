"""Kinesis records to Arrow: the exact schema Spark checks, values intact."""

from datetime import datetime, timezone

import pyarrow as pa

from kinesis_source.executor.arrow import ARROW_SCHEMA, to_record_batch


def test_batch_matches_the_declared_schema_and_values():
    ts = datetime(2026, 11, 21, 20, 0, 0, 123456, tzinfo=timezone.utc)
    records = [
        {"Data": b"\x00\xffab", "PartitionKey": "k1", "SequenceNumber": "4959" + "0" * 52,
         "ApproximateArrivalTimestamp": ts},
        {"Data": b"", "PartitionKey": "k2", "SequenceNumber": "4959" + "0" * 51 + "1",
         "ApproximateArrivalTimestamp": ts, "SubSequenceNumber": 3},
    ]
    batch = to_record_batch("orders", "shardId-000000000001", records)
    assert batch.schema == ARROW_SCHEMA
    assert batch.schema.field("approximateArrivalTimestamp").type == pa.timestamp("us", tz="UTC")
    rows = batch.to_pylist()
    assert rows[0]["data"] == b"\x00\xffab" and rows[1]["data"] == b""
    assert rows[0]["streamName"] == "orders" and rows[1]["shardId"] == "shardId-000000000001"
    assert rows[0]["sequenceNumber"] == records[0]["SequenceNumber"]
    assert [r["subSequenceNumber"] for r in rows] == [0, 3]
    assert rows[0]["approximateArrivalTimestamp"] == ts


def test_empty_batch_still_has_the_schema():
    assert to_record_batch("s", "a", []).schema == ARROW_SCHEMA


def test_a_record_without_a_partition_key_has_a_null_one():
    """Kinesis returns no PartitionKey for records written without one (streams with the AUTO
    record distribution strategy): the column is null, the record is read like any other."""
    from kinesis_source.read_rate import page_bytes

    records = [
        {"Data": b"a", "PartitionKey": "k", "SequenceNumber": "1", "ApproximateArrivalTimestamp": 1.0},
        {"Data": b"bb", "SequenceNumber": "2", "ApproximateArrivalTimestamp": 2.0},
    ]
    batch = to_record_batch("s", "shard-0", records)
    assert batch.column("partitionKey").to_pylist() == ["k", None]
    assert batch.column("data").to_pylist() == [b"a", b"bb"]
    assert page_bytes(records) == 1 + 1 + 2  # what the shard's byte budget is charged


def test_arrival_times_are_microseconds_rounded_as_python_rounds_them():
    """Arrow computes a page's arrival microseconds; they are what a per-record round gives,
    for Kinesis' millisecond times, for other floats (halves included), and with a datetime or
    a null among them."""
    import random

    rng = random.Random(5)
    stamps: list = [1_790_000_000 + rng.randrange(10**9) / 1000 for _ in range(500)]  # milliseconds
    stamps += [1_790_000_000 + rng.random() for _ in range(500)]
    stamps += [1.0000005, 2.5e-6, 1_790_000_000.0000005, None]
    records = [{"Data": b"", "SequenceNumber": str(i), "ApproximateArrivalTimestamp": s} for i, s in enumerate(stamps)]
    got = to_record_batch("s", "a", records).column("approximateArrivalTimestamp").cast(pa.int64()).to_pylist()
    assert got == [None if s is None else round(s * 1_000_000) for s in stamps]
    records[0]["ApproximateArrivalTimestamp"] = datetime(2026, 1, 1, tzinfo=timezone.utc)  # parsed elsewhere
    mixed = to_record_batch("s", "a", records).column("approximateArrivalTimestamp").cast(pa.int64()).to_pylist()
    assert mixed == [round(datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp() * 1_000_000)] + got[1:]
