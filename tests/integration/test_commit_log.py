"""Format 4's commit log on a moto server: commits as small entries, compactions when the ring
fills, and every interruption read back right by a restarted query's new store."""

from __future__ import annotations

import random
import uuid

import pytest

from kinesis_source.checkpoints import commit_log
from kinesis_source.checkpoints.deltas import RING
from kinesis_source.checkpoints.store import CheckpointStore
from kinesis_source.checkpoints.writes import FencedWriter
from kinesis_source.errors import CheckpointFencedError
from kinesis_source.positions import Position, ShardId

SEQ = 49590338271490256608559692538361571095921575989136588898


def sid(i: int) -> ShardId:
    return ShardId("s", f"shardId-{i:012d}")


@pytest.fixture
def store(ddb):
    s = CheckpointStore(ddb, "kinesis_ddb_checkpoints", f"log-{uuid.uuid4().hex[:8]}")
    s.ensure_table(create=True)
    return s


def reread(store: CheckpointStore) -> dict[ShardId, Position]:
    return CheckpointStore(store.client, store.table, store.app).snapshot().positions()


def keys(store: CheckpointStore, prefix: str) -> set[str]:
    items = store.client.get_paginator("query").paginate(
        TableName=store.table, KeyConditionExpression="app = :a",
        ExpressionAttributeValues={":a": {"S": store.app}},
    ).build_full_result()["Items"]
    return {i["key"]["S"] for i in items if i["key"]["S"].startswith(prefix)}


def moving(rng: random.Random, truth: dict, shards: int, count: int, step: int) -> dict:
    """``count`` of ``shards`` shards moved forward (recorded in ``truth``), each to a sequence
    number of its own (random digits past a common prefix, as little alike as Kinesis')."""
    moved = {
        sid(i): Position.after(f"{SEQ // 10**40 + step}{rng.randrange(10**39, 10**40)}")
        for i in rng.sample(range(shards), count)
    }
    truth.update(moved)
    return moved


def test_commits_past_the_ring_compact_and_read_back_the_same_at_every_step(store):
    rng = random.Random(7)
    epoch = store.claim("o", "h").epoch
    truth: dict[ShardId, Position] = {}
    store.commit(epoch, "o", moving(rng, truth, 200, 200, 0))
    for step in range(1, 2 * RING + 10):
        store.commit(epoch, "o", moving(rng, truth, 200, 20, step))
        if step % 16 == 0:
            assert reread(store) == truth, step
    assert reread(store) == truth
    assert len(keys(store, "log#")) == RING  # the ring's slots are reused, never more
    assert keys(store, "shards#")  # the log was folded into the buckets
    assert store.snapshot_meta().compacted_through is not None


def test_a_compaction_cut_short_before_its_mark_is_read_right_and_done_again(store, monkeypatch):
    rng = random.Random(8)
    epoch = store.claim("o", "h").epoch
    truth: dict[ShardId, Position] = {}
    for step in range(5):
        store.commit(epoch, "o", moving(rng, truth, 100, 30, step))

    def dies(*args, **kwargs):
        raise RuntimeError("the driver died here")

    monkeypatch.setattr(commit_log, "_mark", dies)
    with pytest.raises(RuntimeError):
        store.compact(epoch)
    monkeypatch.undo()
    assert keys(store, "shards#") and store.snapshot_meta().compacted_through is None
    assert reread(store) == truth  # new buckets, every entry applied again over them
    again = CheckpointStore(store.client, store.table, store.app)
    epoch = again.claim("o2", "h").epoch
    assert again.snapshot().positions() == truth
    again.commit(epoch, "o2", moving(rng, truth, 100, 30, 9))
    again.compact(epoch)
    assert reread(again) == truth and again.snapshot_meta().compacted_through is not None


def taken_over(store: CheckpointStore, seed: int, newer_moves: int):
    """``store``'s query commits every shard of 50, then a newer query claims the application
    and commits ``newer_moves`` of them; returns the rng, the truth, the older query's epoch and
    the newer query's store and epoch."""
    rng = random.Random(seed)
    old_epoch = store.claim("old", "h").epoch
    truth: dict[ShardId, Position] = {}
    store.commit(old_epoch, "old", moving(rng, truth, 50, 50, 0))
    newer = CheckpointStore(store.client, store.table, store.app)
    epoch = newer.claim("new", "h2").epoch
    newer.snapshot()
    newer.commit(epoch, "new", moving(rng, truth, 50, newer_moves, 1))
    return rng, truth, old_epoch, newer, epoch


def test_a_fenced_querys_late_compaction_is_refused_and_loses_nothing(store):
    rng, truth, old_epoch, newer, epoch = taken_over(store, 9, 50)
    newer.compact(epoch)
    with pytest.raises(CheckpointFencedError):
        store.compact(old_epoch)  # its buckets are the newer query's: refused
    with pytest.raises(CheckpointFencedError):
        store.commit(old_epoch, "old", moving(rng, {}, 50, 5, 2))
    assert reread(store) == truth


def test_a_fenced_query_compacting_before_the_new_one_does_changes_nothing(store):
    _, truth, old_epoch, newer, epoch = taken_over(store, 10, 20)
    with pytest.raises(CheckpointFencedError):
        store.compact(old_epoch)  # its buckets land (older than the log), its mark does not
    assert reread(store) == truth
    newer.compact(epoch)
    assert reread(store) == truth


def test_a_fenced_querys_late_compaction_does_not_bring_back_a_shard_the_newer_one_dropped(store):
    old_epoch = store.claim("old", "h").epoch
    parent = sid(1)
    store.commit(old_epoch, "old", {parent: Position.after("5")})
    newer = CheckpointStore(store.client, store.table, store.app)
    epoch = newer.claim("new", "h2").epoch
    newer.snapshot()
    newer.commit(epoch, "new", {parent: Position.shard_end()})
    newer.commit(epoch, "new", {}, forget=[parent])  # finished, its children committed
    newer.compact(epoch)  # the parent's bucket is now empty
    with pytest.raises(CheckpointFencedError):
        store.compact(old_epoch)  # would write the parent back, at 5, into that bucket
    assert reread(store) == {}


def test_a_reset_cut_short_still_retires_every_position(store, monkeypatch):
    epoch = store.claim("o", "h").epoch
    store.commit(epoch, "o", {sid(i): Position.after(str(SEQ + i)) for i in range(100)})
    store.compact(epoch)
    store.commit(epoch, "o", {sid(1): Position.after(str(SEQ + 500))})

    def dies(self, *args, **kwargs):
        raise RuntimeError("the CLI died here")

    monkeypatch.setattr(FencedWriter, "run", dies)  # the tidying deletes
    with pytest.raises(RuntimeError):
        store.reset("TRIM_HORIZON", by="tester")
    monkeypatch.undo()
    assert keys(store, "shards#") and keys(store, "log#")  # left behind, and not read:
    assert reread(store) == {}
    epoch = store.claim("o2", "h").epoch
    store.commit(epoch, "o2", {sid(3): Position.after("7")})
    assert reread(store) == {sid(3): Position.after("7")}


@pytest.mark.parametrize("shards", [40, 1000, 4000])
def test_a_commits_write_units_follow_the_shards_that_moved_not_the_streams_size(store, shards):
    rng = random.Random(shards)
    epoch = store.claim("o", "h").epoch
    truth: dict[ShardId, Position] = {}
    store.commit(epoch, "o", moving(rng, truth, shards, shards, 0))
    store.compact(epoch)
    units = []
    for step in range(1, 4):
        store.commit(epoch, "o", moving(rng, truth, shards, 40, step))
        units.append(store.writer.last_commit_units)
    # 40 positions deflate to under 2 KB: the check (2) and a 2 KB entry (4), transactional
    assert max(units) <= 6, units
    assert reread(store) == truth
