"""``checkpointIntervalMs``: the driver's commits reach DynamoDB (moto) at most that often, what
is held back is written by the next commit, by a trigger that plans no batch and by the stop, and
the callbacks hear each DynamoDB write once. The batches are driven as Spark calls the source
(``latestOffset``'s eager write, the check before a batch, ``commit`` a batch behind) on a clock
the test moves."""

from __future__ import annotations

import uuid

import pytest

from kinesis_source.aws.kinesis import ShardInfo
from kinesis_source.checkpoints.store import CheckpointStore
from kinesis_source.driver.application import Application
from kinesis_source.driver.commits import Checkpointer
from kinesis_source.options import SourceOptions
from kinesis_source.positions import Offset, Position, ShardId

STREAM = "orders"
SHARDS = [ShardId(STREAM, f"shardId-{i:012d}") for i in range(3)]


class Listing:
    """Three open shards that never reshard: all the commit path asks of the planner."""

    def listed(self):
        return {STREAM: [ShardInfo(s.shard) for s in SHARDS]}

    def shard_ids(self):
        return set(SHARDS)

    def stream_identities(self):
        return {STREAM: "2026-11-28T00:00:00.000+00:00"}

    def streams_entering(self, start):
        return []

    def resolve_initial(self, spec, streams=None):
        return Offset({k: Position.trim_horizon() for k in SHARDS})


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def offset_at(second: int) -> Offset:
    """Every shard moved once per second."""
    return Offset({k: Position.after(str(1000 * second + i)) for i, k in enumerate(SHARDS)})


@pytest.fixture
def committer(ddb):
    def make(interval_ms: int):
        opts = SourceOptions.parse({
            "streamName": STREAM, "applicationName": f"interval-{uuid.uuid4().hex[:8]}",
            "checkpointIntervalMs": str(interval_ms), "region": "us-east-1",
        })
        store = CheckpointStore(ddb, opts.checkpoint_table, opts.application_name)
        heard = []
        clock = Clock()
        checkpointer = Checkpointer(Application(opts, store, Listing()), heard.append, clock=clock)
        return checkpointer, store, clock, heard
    return make


def stored(store: CheckpointStore) -> dict[ShardId, Position]:
    return CheckpointStore(store.client, store.table, store.app).snapshot().positions()


def batch(checkpointer: Checkpointer, second: int) -> None:
    """One trigger at ``second`` that plans a batch: every batch up to ``second - 1`` is done."""
    with checkpointer.committing(offset_at(second - 1)):
        pass
    checkpointer.after_planning(batch_follows=True)
    checkpointer.before_batch()
    checkpointer.commit(offset_at(second - 2))


def test_commits_come_at_most_once_per_interval_and_lag_at_most_the_interval(committer):
    checkpointer, store, clock, heard = committer(10_000)
    for second in range(2, 36):
        clock.now = float(second)
        batch(checkpointer, second)
        # what a restart without Spark's checkpoint resumes from: never more than the interval
        # (plus the batch in flight) behind the last finished batch
        finished = second - 1
        resumed = stored(store)[SHARDS[0]]
        assert int(resumed.seq) // 1000 >= finished - 10, (second, resumed)
    # a write at 2 s (the first), then one per 10 s: 12, 22, 32
    assert len(heard) == 4
    assert stored(store) == offset_at(31).shards


def test_a_trigger_without_a_batch_and_the_stop_write_what_the_interval_held_back(committer):
    checkpointer, store, clock, heard = committer(60_000)
    for second in range(2, 6):
        clock.now = float(second)
        batch(checkpointer, second)
    assert stored(store) == offset_at(1).shards and len(heard) == 1
    clock.now = 6.0
    with checkpointer.committing(offset_at(5)):  # nothing new: no batch follows
        pass
    checkpointer.after_planning(batch_follows=False)
    assert stored(store) == offset_at(5).shards and len(heard) == 2
    for second in range(7, 9):
        clock.now = float(second)
        batch(checkpointer, second)
    assert stored(store) == offset_at(5).shards
    checkpointer.close()  # the query stops
    assert stored(store) == offset_at(7).shards and len(heard) == 3
    assert dict(heard[-1].positions) == {k: p.seq for k, p in offset_at(7).shards.items()}


def test_without_an_interval_every_batch_is_written(committer):
    checkpointer, store, clock, heard = committer(0)
    for second in range(2, 8):
        clock.now = float(second)
        batch(checkpointer, second)
        assert stored(store) == offset_at(second - 1).shards
    assert len(heard) == 6


def test_without_latest_offsets_start_the_commits_end_is_what_a_flush_writes(committer):
    """pyspark < 4.2 gives ``latestOffset`` no start: only ``commit(end)`` says what is done."""
    checkpointer, store, clock, heard = committer(60_000)
    for second in range(2, 6):
        clock.now = float(second)
        checkpointer.commit(offset_at(second))
    assert stored(store) == offset_at(2).shards
    checkpointer.after_planning(batch_follows=False)  # a trigger that found nothing new
    assert stored(store) == offset_at(5).shards and len(heard) == 2
