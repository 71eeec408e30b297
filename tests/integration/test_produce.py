"""`kinesis-ddb produce`: numbered records, optionally KPL-aggregated, on the wire as promised."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kinesis_source import kpl


@pytest.mark.backends("moto")
def test_produce_writes_numbered_aggregated_records(kinesis, kinesis_backend, make_stream):
    stream = make_stream(2)
    proc = subprocess.run(
        [sys.executable, "-m", "kinesis_source.tools.cli", "produce", "--stream", stream,
         "--records", "200", "--rate", "2000", "--size", "40", "--keys", "8", "--aggregate", "10",
         "--endpoint-url", kinesis_backend, "--region", "us-east-1"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"put 200 records to stream {stream}" in proc.stdout
    kinesis_records, users, full = 0, [], 0
    for shard in kinesis.list_shards(StreamName=stream)["Shards"]:
        first = int(shard["HashKeyRange"]["StartingHashKey"])
        last = int(shard["HashKeyRange"]["EndingHashKey"])
        it = kinesis.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        in_shard = 0
        for rec in kinesis.get_records(ShardIterator=it)["Records"]:
            kinesis_records += 1
            decoded = kpl.decode(rec["Data"])
            # every user record belongs to this shard, or readers (KCL, us) would drop it
            assert all(first <= kpl.effective_hash_key(key) <= last for key, _, _ in decoded)
            users += [(key, data) for key, data, _ in decoded]
            in_shard += len(decoded)
        full += -(-in_shard // 10)
    assert kinesis_records == full  # one call of 200: per shard, aggregates of 10 but the last
    payloads = sorted(d for _, d in users)
    assert payloads == sorted(f"r-{n:09d}".ljust(40, ".").encode() for n in range(200))
    assert {k for k, _ in users} == {f"key-{i}" for i in range(8)}
