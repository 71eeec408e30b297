"""The embedded local endpoint (the demo's, and every test's moto server)."""

from __future__ import annotations

import threading
import uuid

import boto3

from tests.support.waiting import wait_for

WRITERS, PUTS = 8, 150


def test_concurrent_puts_to_one_shard_keep_every_record(endpoint):
    """moto's own server can give two concurrent puts on a shard one sequence number (the
    second record then overwrites the first: a sink test once lost a record so); the embedded
    endpoint makes Kinesis writes one at a time. Eight writers at once, each record read back."""
    kinesis = boto3.client("kinesis", endpoint_url=endpoint.url)
    stream = f"concurrent-puts-{uuid.uuid4().hex[:8]}"  # (the session's server is shared)
    kinesis.create_stream(StreamName=stream, ShardCount=1)
    wait_for(lambda: kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"][
        "StreamStatus"] == "ACTIVE", timeout=30, what="the stream")
    answers: list[str] = []

    def write(writer: int) -> None:
        for i in range(PUTS):
            resp = kinesis.put_record(StreamName=stream, Data=f"{writer}-{i}".encode(), PartitionKey="k")
            answers.append(resp["SequenceNumber"])

    threads = [threading.Thread(target=write, args=(w,)) for w in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    shard = kinesis.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard,
                                          ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    records = kinesis.get_records(ShardIterator=iterator, Limit=10_000)["Records"]
    assert len(set(answers)) == WRITERS * PUTS, "two puts were given one sequence number"
    assert sorted(r["Data"].decode() for r in records) == sorted(f"{w}-{i}" for w in range(WRITERS)
                                                                for i in range(PUTS))
