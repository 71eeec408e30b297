"""KPL aggregates mixed with plain records, read by real Spark."""

from __future__ import annotations

import hashlib
import random

import pytest

from kinesis_source.kpl import MAGIC
from tests.support.aggregates import (
    aggregate,
    corrupt_checksum,
    truncated_body,
    wrong_digest,
)
from tests.support.spark_query import failure_of, running
from tests.support.waiting import wait_for

pytestmark = pytest.mark.spark


def put(kinesis, stream, key, data):
    resp = kinesis.put_record(StreamName=stream, PartitionKey=key, Data=data)
    return resp["ShardId"], resp["SequenceNumber"]


def hash_ranges(kinesis, stream):
    """Each shard's id and (first, last) hash key, in hash key order."""
    shards = []
    for s in kinesis.list_shards(StreamName=stream)["Shards"]:
        hashes = s["HashKeyRange"]
        shards.append((s["ShardId"], int(hashes["StartingHashKey"]), int(hashes["EndingHashKey"])))
    return sorted(shards, key=lambda s: s[1])


def keys_by_shard(kinesis, stream, keys):
    """``keys`` grouped by the shard Kinesis routes them to (MD5 of the key in its range), as
    the KPL groups user records into aggregates."""
    hashed = {k: int.from_bytes(hashlib.md5(k.encode()).digest(), "big") for k in keys}
    return {
        shard_id: [k for k in keys if first <= hashed[k] <= last]
        for shard_id, first, last in hash_ranges(kinesis, stream)
    }


def test_aggregates_and_plain_records_arrive_with_keys_and_sub_sequence_numbers(
    spark, kinesis, make_stream, source_options, tmp_path
):
    stream = make_stream(2)
    # each aggregate holds user records of one shard's keys, as the KPL makes them
    buckets = list(keys_by_shard(kinesis, stream, [f"user-{i}" for i in range(26)]).items())
    assert all(len(keys) >= 3 for _, keys in buckets)
    expected = set()
    for a in range(10):
        target, keys = buckets[a % 2]
        users = [(keys[(a * 100 + i) % len(keys)], f"agg-{a}-{i}".encode()) for i in range(100)]
        shard, seq = put(kinesis, stream, *aggregate(users))
        assert shard == target
        expected |= {(shard, seq, i, key, data) for i, (key, data) in enumerate(users)}
        for p in range(20):
            key, data = f"plain-{p}", f"plain-{a}-{p}".encode()
            shard, seq = put(kinesis, stream, key, data)
            expected.add((shard, seq, 0, key, data))
    assert len(expected) == 1200
    with running(spark, {**source_options, "streamName": stream}, tmp_path / "ck") as (_, sink):
        wait_for(lambda: sink.count() >= 1200, timeout=120, what="1,200 user records")
    got = [(r.shard_id, r.seq, r.sub_seq, r.partition_key, r.data) for r in sink.rows()]
    assert len(got) == len(set(got)) == 1200
    assert set(got) == expected


def test_corrupt_aggregate_fails_the_query_naming_shard_and_sequence_number(
    spark, kinesis, make_stream, source_options, tmp_path
):
    stream = make_stream(1)
    put(kinesis, stream, "k", b"before")
    key, data = aggregate([("a", b"1"), ("b", b"2")])
    shard, seq = put(kinesis, stream, key, truncated_body(data))
    message = failure_of(spark, {**source_options, "streamName": stream}, tmp_path / "ck")
    assert f"Corrupt KPL aggregate in shard {stream}/{shard} at sequence number {seq}" in message
    assert "runs past the end" in message and "onCorruptAggregate=skip" in message


def test_corrupt_aggregate_skipped_the_rest_arrive(
    spark, kinesis, make_stream, source_options, tmp_path
):
    stream = make_stream(1)
    key, data = aggregate([("a", b"1"), ("b", b"2")])
    put(kinesis, stream, "k", b"before")
    put(kinesis, stream, key, truncated_body(data))
    put(kinesis, stream, key, data)
    put(kinesis, stream, "k", b"after")
    options = {**source_options, "streamName": stream, "onCorruptAggregate": "skip"}
    with running(spark, options, tmp_path / "ck") as (query, sink):
        wait_for(lambda: sink.count() >= 4, timeout=90, what="the good records")
        assert query.isActive
    assert [r.data for r in sink.rows()] == [b"before", b"1", b"2", b"after"]


def test_plain_records_that_start_with_the_magic_arrive_unchanged(
    spark, kinesis, make_stream, source_options, tmp_path
):
    # KCL and aws-kinesis-agg take a record for an aggregate only when its MD5 matches too;
    # random binary payloads start with the magic once in 2^32 records.
    stream = make_stream(1)
    _, good = aggregate([("a", b"1"), ("b", b"2")])
    lookalikes = {
        10: MAGIC + random.Random(14).randbytes(200),
        25: corrupt_checksum(good),
        40: wrong_digest(good),
    }
    expected = []
    for i in range(50):
        data = lookalikes.get(i, f"plain-{i}".encode())
        _, seq = put(kinesis, stream, f"key-{i}", data)
        expected.append((seq, 0, f"key-{i}", data))
    with running(spark, {**source_options, "streamName": stream}, tmp_path / "ck") as (query, sink):
        wait_for(
            lambda: sink.count() >= 50 or not query.isActive, timeout=90, what="the 50 records"
        )
        assert query.isActive, query.exception()
    assert [(r.seq, r.sub_seq, r.partition_key, r.data) for r in sink.rows()] == expected


def test_user_records_outside_the_shards_hash_range_are_dropped(
    spark, kinesis, make_stream, source_options, tmp_path
):
    # After a reshard the KPL can put an aggregate built for the old shard map into a shard
    # that owns only some of its user records; it re-sends the others to their shard.
    stream = make_stream(2)
    (shard_a, a_first, a_last), (_, b_first, b_last) = hash_ranges(kinesis, stream)
    # well inside each range: the backends disagree on whether EndingHashKey is inclusive
    in_a = [a_first + 1000, (a_first + a_last) // 2, a_last - 1000]
    in_b = [b_first + 1000, (b_first + b_last) // 2, b_last - 1000]
    hash_keys = [in_a[0], in_b[0], in_b[1], in_a[1], in_b[2], in_a[2]]
    users = [(f"user-{i}", f"user-data-{i}".encode(), str(h)) for i, h in enumerate(hash_keys)]
    key, data = aggregate(users)
    resp = kinesis.put_record(
        StreamName=stream, PartitionKey=key, Data=data, ExplicitHashKey=str(in_a[0])
    )
    assert resp["ShardId"] == shard_a
    resp = kinesis.put_record(
        StreamName=stream, PartitionKey="last", Data=b"last", ExplicitHashKey=str(in_a[1])
    )
    assert resp["ShardId"] == shard_a
    expected = [(shard_a, i, k, d) for i, (k, d, h) in enumerate(users) if int(h) in in_a]
    expected.append((shard_a, 0, "last", b"last"))
    with running(spark, {**source_options, "streamName": stream}, tmp_path / "ck") as (query, sink):
        # "last" follows the aggregate in its shard: once it is in, the aggregate was read
        wait_for(
            lambda: any(r.data == b"last" for r in sink.rows()) or not query.isActive,
            timeout=90,
            what="the record after the aggregate",
        )
        assert query.isActive, query.exception()
    assert [(r.shard_id, r.sub_seq, r.partition_key, r.data) for r in sink.rows()] == expected
