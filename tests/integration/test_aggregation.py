"""KPL aggregates mixed with plain records, read by real Spark."""

from __future__ import annotations

import random

import pytest

from kinesis_source.kpl import MAGIC
from tests.support.aggregates import aggregate, corrupt_checksum, truncated_body, wrong_digest
from tests.support.spark_query import failure_of, running
from tests.support.waiting import wait_for

pytestmark = pytest.mark.spark


def put(kinesis, stream, key, data):
    resp = kinesis.put_record(StreamName=stream, PartitionKey=key, Data=data)
    return resp["ShardId"], resp["SequenceNumber"]


def test_aggregates_and_plain_records_arrive_with_keys_and_sub_sequence_numbers(
    spark, kinesis, make_stream, source_options, tmp_path
):
    stream = make_stream(2)
    expected = set()
    for a in range(10):
        users = [(f"user-{(a * 100 + i) % 13}", f"agg-{a}-{i}".encode()) for i in range(100)]
        shard, seq = put(kinesis, stream, *aggregate(users))
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
