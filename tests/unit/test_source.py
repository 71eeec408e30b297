"""The reader's glue outside Spark: what partitions carry and what ``read`` makes of a range."""

from __future__ import annotations

import threading

import kinesis_source.executor as executor
from kinesis_source import source
from kinesis_source.aws.clients import AwsSettings
from kinesis_source.driver.application import Application
from kinesis_source.driver.commits import Checkpointer
from kinesis_source.executor import RangePartition, ShardRead
from kinesis_source.options import SourceOptions
from kinesis_source.positions import Offset, Position, ShardId, ShardRange
from kinesis_source.tip_reports import ReportAddress
from tests.support.aggregates import aggregate
from tests.unit.fake_kinesis import FakeKinesis, FakeShard, log_of
from tests.unit.test_committer import DEADLINE_S, Listing, MemoryStore
from tests.unit.test_planner import planner_on


class Unfenced:
    """The checkpointer, as far as ``partitions`` asks it (its fence check before a batch is
    tested in test_committer.py; here nobody else owns the application)."""

    def before_batch(self) -> None:
        pass


def reader_on(opts: SourceOptions, planner, **kw) -> source.KinesisStreamReader:
    """A reader with an injected planner and no DynamoDB."""
    reader = source.KinesisStreamReader(opts, planner=planner, **kw)
    reader._checkpointer = Unfenced()  # type: ignore[assignment]
    return reader


def test_partitions_carry_their_shards_hash_range_to_the_executor():
    fake = FakeKinesis({"a": FakeShard(hash_range=(0, 99)), "b": FakeShard(), "c": FakeShard()})
    planner = planner_on(fake)
    opts = SourceOptions.parse({"streamName": "s", "applicationName": "app", "region": "us-east-1"})
    reader = reader_on(opts, planner)
    try:
        a, b, gone = ShardId("s", "a"), ShardId("s", "b"), ShardId("s", "gone")
        start = Offset({a: Position.trim_horizon(), b: Position.trim_horizon()})
        end = Offset({a: Position.after("5"), b: Position.after("7"), gone: Position.after("1")})
        parts = reader.partitions(start.to_dict(), end.to_dict())
        assert {(r.range.shard_id, r.hash_range) for p in parts for r in p.reads} == {
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
        partition = RangePartition.of(ShardRead(rng, hash_range=hash_range), settings, opts)
        batches = reader.read(partition)
        return [(r["data"], r["subSequenceNumber"]) for b in batches for r in b.to_pylist()]

    plain = f"d{recs[1][0]}".encode()  # the plain record's key hashes wherever: never filtered
    assert rows((0, 99)) == [(b"in", 0), (b"in-too", 2), (plain, 0)]
    assert rows(None) == [(b"in", 0), (b"out", 1), (b"in-too", 2), (plain, 0)]


def test_partitions_group_shards_into_tasks_each_range_once():
    names = [f"s{i:02d}" for i in range(10)]
    fake = FakeKinesis({n: FakeShard() for n in names})
    planner = planner_on(fake)
    try:
        start = Offset({ShardId("s", n): Position.trim_horizon() for n in names})
        end = Offset({ShardId("s", n): Position.after(str(i + 1)) for i, n in enumerate(names)})
        cases = [({}, 4, 4), ({}, 100, 10), ({"shardsPerTask": "1"}, 2, 10), ({"shardsPerTask": "4"}, 100, 3)]
        for extra, parallelism, tasks in cases:
            opts = SourceOptions.parse({"streamName": "s", "applicationName": "app", "region": "us-east-1", **extra})
            reader = reader_on(opts, planner, parallelism=parallelism)
            parts = reader.partitions(start.to_dict(), end.to_dict())
            assert len(parts) == tasks, (extra, parallelism)
            assert sorted(r.shard_id for p in parts for r in p.ranges) == names
    finally:
        planner.close()


def test_a_task_of_several_shards_reads_each_in_order_and_reports_all_tips_at_once(monkeypatch):
    recs = log_of(40)
    shards = {n: FakeShard(recs[i::4]) for i, n in enumerate("abcd")}
    fake = FakeKinesis(shards)
    monkeypatch.setattr(executor, "shared_client", lambda settings, service: fake)
    sent = []
    monkeypatch.setattr(executor, "send_reports", lambda address, tips: sent.append(tips) or True)
    opts = SourceOptions.parse({"streamName": "s", "applicationName": "app", "region": "us-east-1",
                                "maxRecordsPerFetch": "3"})
    reads = tuple(ShardRead(ShardRange("s", n, Position.trim_horizon(), sh.records[-2][0]))
                  for n, sh in shards.items())
    partition = RangePartition.of(reads, AwsSettings.for_kinesis(opts), opts, ReportAddress("127.0.0.1", 1, "t"))
    rows = [r for b in source.KinesisStreamReader(opts).read(partition) for r in b.to_pylist()]
    for n, sh in shards.items():
        assert [r["sequenceNumber"] for r in rows if r["shardId"] == n] == [s for s, _ in sh.records[:-1]]
    assert len(sent) == 1 and sorted(t.shard.shard for t in sent[0]) == list("abcd")


def test_partitions_carry_the_readers_client_settings():
    """Executors' clients: GetRecords throttles come back to the reader (its byte model paces
    the retry), and with fan-out a subscription silent for subscribeTimeoutMs is given up."""

    class Consumers:
        def arns(self):
            return {"s": "arn:aws:kinesis:us-east-1:123456789012:stream/s/consumer/app:1"}

    fake = FakeKinesis({"a": FakeShard()})
    planner = planner_on(fake)
    start = Offset({ShardId("s", "a"): Position.trim_horizon()})
    end = Offset({ShardId("s", "a"): Position.after("5")})
    base = {"streamName": "s", "applicationName": "app", "region": "us-east-1"}
    try:
        polling = reader_on(SourceOptions.parse(base), planner)
        [part] = polling.partitions(start.to_dict(), end.to_dict())
        assert part.settings.paced_reads and part.settings.read_timeout_s == 30
        efo = SourceOptions.parse({**base, "consumerMode": "efo", "subscribeTimeoutMs": "7000"})
        reader = reader_on(efo, planner)
        reader._consumers = Consumers()
        [part] = reader.partitions(start.to_dict(), end.to_dict())
        assert part.reads[0].consumer_arn is not None and part.settings.read_timeout_s == 7.0
    finally:
        planner.close()


class NoStreamEnters:
    """Where streams added since Spark's checkpoint enter: none here."""

    def entering(self, begin):
        return {}


def test_latest_offset_waits_for_its_write_only_when_no_batch_follows():
    """A batch's ``partitions`` waits for the eager write; when ``latestOffset`` finds nothing
    new no batch follows, and Spark never calls ``stop()``: a run that ends there (AvailableNow)
    would lose the write with the helper unless this call waits for it."""
    recs = log_of(3)
    fake = FakeKinesis({"a": FakeShard(recs)})
    planner = planner_on(fake)
    opts = SourceOptions.parse({"streamName": "s", "applicationName": "app", "region": "us-east-1",
                                "dynamodbEndpointUrl": "http://127.0.0.1:9"})  # the store is replaced
    store = MemoryStore()
    app = Application(opts, store, Listing([]), owner="test")  # type: ignore[arg-type]
    app.epoch = 3  # claimed
    reader = source.KinesisStreamReader(opts, planner=planner)
    reader._checkpointer, reader._start = Checkpointer(app), NoStreamEnters()  # type: ignore[assignment]
    a = ShardId("s", "a")
    try:
        start = Offset({a: Position.after(recs[0][0])}).to_dict()
        store.release.clear()  # the write cannot finish until released
        end = reader.latestOffset(start)  # a batch follows: returns with its write under way
        assert end != start and store.started.wait(DEADLINE_S) and store.commits == []
        store.release.set()
        reader.checkpointer.before_batch()  # (the batch's partitions)
        assert store.commits == [{a: Position.after(recs[0][0])}]
        store.release.clear()
        release = threading.Timer(0.2, store.release.set)
        release.start()
        assert reader.latestOffset(end) == end  # nothing new: no batch follows
        assert store.commits[-1] == {a: Position.after(recs[2][0])}  # written before it returned
        release.join()
    finally:
        reader.checkpointer.close()
        planner.close()
