"""The reader's glue outside Spark: what partitions carry and what ``read`` makes of a range."""

from __future__ import annotations

import kinesis_source.executor as executor
from kinesis_source import source
from kinesis_source.aws.clients import AwsSettings
from kinesis_source.executor import RangePartition
from kinesis_source.options import SourceOptions
from kinesis_source.positions import Offset, Position, ShardId, ShardRange
from tests.support.aggregates import aggregate
from tests.unit.fake_kinesis import FakeKinesis, FakeShard, log_of
from tests.unit.test_planner import planner_on


def test_partitions_carry_their_shards_hash_range_to_the_executor():
    fake = FakeKinesis({"a": FakeShard(hash_range=(0, 99)), "b": FakeShard(), "c": FakeShard()})
    planner = planner_on(fake)
    opts = SourceOptions.parse({"streamName": "s", "applicationName": "app", "region": "us-east-1"})
    reader = source.KinesisStreamReader(opts, planner=planner)
    try:
        a, b, gone = ShardId("s", "a"), ShardId("s", "b"), ShardId("s", "gone")
        start = Offset({a: Position.trim_horizon(), b: Position.trim_horizon()})
        end = Offset({a: Position.after("5"), b: Position.after("7"), gone: Position.after("1")})
        parts = reader.partitions(start.to_dict(), end.to_dict())
        assert {(p.range.shard_id, p.hash_range) for p in parts} == {
            ("a", (0, 99)),
            ("b", None),
            ("gone", None),  # not listed: its range is unknown, nothing is dropped
        }
    finally:
        planner.close()


def test_read_drops_the_user_records_outside_the_partitions_hash_range(monkeypatch):
    recs = log_of(2)
    _, agg = aggregate([("k0", b"in", str(50)), ("k1", b"out", str(500)), ("k2", b"in-too", "99")])
    fake = FakeKinesis({"a": FakeShard(recs, payloads={recs[0][0]: agg})})
    monkeypatch.setattr(executor, "shared_client", lambda settings, service: fake)
    opts = SourceOptions.parse({"streamName": "s", "applicationName": "app", "region": "us-east-1"})
    reader = source.KinesisStreamReader(opts)
    rng = ShardRange("s", "a", Position.trim_horizon(), recs[1][0])

    def rows(hash_range):
        settings = AwsSettings.for_kinesis(opts)
        partition = RangePartition.of(rng, settings, opts, None, hash_range)
        batches = reader.read(partition)
        return [(r["data"], r["subSequenceNumber"]) for b in batches for r in b.to_pylist()]

    plain = f"d{recs[1][0]}".encode()  # the plain record's key hashes wherever: never filtered
    assert rows((0, 99)) == [(b"in", 0), (b"in-too", 2), (plain, 0)]
    assert rows(None) == [(b"in", 0), (b"out", 1), (b"in-too", 2), (plain, 0)]
