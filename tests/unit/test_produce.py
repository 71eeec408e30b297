"""The load generator's aggregates: user records of one shard each, as the KPL makes them."""

from __future__ import annotations

import hashlib

from kinesis_source import kpl
from kinesis_source.tools.produce import LoadProducer

HALF = 2**127


def _shard(shard_id, first, last, closed=False):
    seqs = {"StartingSequenceNumber": "1"}
    if closed:
        seqs["EndingSequenceNumber"] = "9"
    hashes = {"StartingHashKey": str(first), "EndingHashKey": str(last)}
    return {"ShardId": shard_id, "HashKeyRange": hashes, "SequenceNumberRange": seqs}


class _Pages:
    def paginate(self, StreamName):
        yield {"Shards": [_shard("parent", 0, 2**128 - 1, closed=True), _shard("low", 0, HALF - 1)]}
        yield {"Shards": [_shard("high", HALF, 2**128 - 1)]}


class ShardedStub:
    """Two open shards (lower and upper half of the hash key space) and a closed parent, over
    two pages of ListShards; puts are routed by partition key like Kinesis."""

    def __init__(self):
        self.puts: list[dict] = []

    def get_paginator(self, name):
        assert name == "list_shards"
        return _Pages()

    def put_records(self, StreamName, Records):
        self.puts.extend(Records)
        return {
            "FailedRecordCount": 0,
            "Records": [
                {"ShardId": "high" if _hash(r["PartitionKey"]) >= HALF else "low", "SequenceNumber": "1"}
                for r in Records
            ],
        }


def _hash(key):
    return int.from_bytes(hashlib.md5(key.encode()).digest(), "big")


def test_aggregates_hold_the_user_records_of_one_shard():
    stub = ShardedStub()
    producer = LoadProducer(stub, "s", size=20, keys=8, aggregate=10)
    producer.put(0, 200)
    shards_of_keys = {k: _hash(k) >= HALF for k in (f"key-{i}" for i in range(8))}
    assert len(set(shards_of_keys.values())) == 2  # the keys span both shards
    users = []
    for rec in stub.puts:
        decoded = kpl.decode(rec["Data"])
        assert 1 <= len(decoded) <= 10
        assert {shards_of_keys[k] for k, _, _ in decoded} == {shards_of_keys[rec["PartitionKey"]]}
        users += [d for _, d, _ in decoded]
    assert sorted(users) == sorted(producer.payload(n) for n in range(200))
    # each shard's user records fill aggregates of 10 but the last
    keys = [f"key-{n % 8}" for n in range(200)]
    per_shard = [sum(1 for k in keys if shards_of_keys[k] == up) for up in (False, True)]
    assert len(stub.puts) == sum(-(-n // 10) for n in per_shard)
    assert {s.shard_id for s in producer.snapshot()} == {"low", "high"}
