"""Format 4's commit log read back: every state a reader can meet folds to the committed
positions (items written out here as DynamoDB holds them, no server).

Mutants caught: ``deltas.apply`` taking an entry's position without ``advances`` (an entry the
base already holds would move a shard back); ``read_items`` applying entries at or before the
compaction mark, or in slot order instead of log order; ``Ring.live`` ignoring ``baseEpoch``
(positions from before a reset come back).
"""

from __future__ import annotations

from kinesis_source.checkpoints.deltas import (
    RING,
    bucket_body,
    entry_body,
    pack,
    seq_text,
    slot_key,
)
from kinesis_source.checkpoints.format import StoredShard
from kinesis_source.checkpoints.reading import read_items
from kinesis_source.positions import Position, ShardId

APP = {"app": {"S": "app"}}
A, B, C = ShardId("s", "a"), ShardId("s", "b"), ShardId("s", "c")


def meta(epoch: int, mark: str | None = None, base_epoch: int | None = None) -> dict:
    item = {**APP, "key": {"S": "meta"}, "epoch": {"N": str(epoch)}, "formatVersion": {"N": "4"}}
    if mark:
        item["compactedThrough"] = {"S": mark}
    if base_epoch is not None:
        item["baseEpoch"] = {"N": str(base_epoch)}
    return item


def bucket(key: str, epoch: int, positions: dict[ShardId, str]) -> dict:
    shards = {k: StoredShard(Position.parse(p), epoch, "o", "t") for k, p in positions.items()}
    return {**APP, "key": {"S": key}, "epoch": {"N": str(epoch)},
            "packed": {"B": pack(bucket_body(shards))}}


def entry(slot: int, epoch: int, n: int, positions: dict[ShardId, str], dropped=()) -> dict:
    body = entry_body("o", "t", {k: Position.parse(p) for k, p in positions.items()}, dropped)
    return {**APP, "key": {"S": slot_key(slot)}, "seq": {"S": seq_text(epoch, n)},
            "epoch": {"N": str(epoch)}, "packed": {"B": pack(body)}, "wru": {"N": "4"}}


def positions(items: list[dict]) -> dict[ShardId, str]:
    return {k: s.position.to_str() for k, s in read_items(items).shards.items()}


def test_entries_after_the_mark_apply_over_the_buckets_in_log_order_not_slot_order():
    items = [
        meta(3, mark=seq_text(2, 10)),
        bucket("shards#01", 2, {A: "AFTER:5", B: "AFTER:9"}),
        entry(0, 3, 12, {A: "AFTER:8"}),  # the newer entry sits in the lower slot
        entry(5, 3, 11, {A: "AFTER:7", C: "AFTER:1"}),
        entry(9, 2, 10, {A: "AFTER:100"}),  # held by the buckets already: not read
    ]
    assert positions(items) == {A: "AFTER:8", B: "AFTER:9", C: "AFTER:1"}
    read = read_items(items)
    assert [e.seq for e in read.log] == [seq_text(3, 11), seq_text(3, 12)]
    assert read.ring.last_n == 12 and read.ring.next_slot == 1  # after the newest entry's slot
    assert slot_key(9) in read.ring.free() and slot_key(0) not in read.ring.free()


def test_an_entry_the_buckets_already_hold_changes_nothing_and_a_drop_stays_dropped():
    # a compaction that rewrote the buckets but died before its mark: its entries apply again
    items = [
        meta(4),
        bucket("shards#01", 4, {A: "AFTER:20", C: "SHARD_END"}),
        entry(1, 4, 1, {A: "AFTER:10", B: "SHARD_END"}),
        entry(2, 4, 2, {}, dropped=[B]),
        entry(3, 4, 3, {A: "AFTER:20"}),
    ]
    assert positions(items) == {A: "AFTER:20", C: "SHARD_END"}


def test_nothing_written_before_a_reset_is_read():
    items = [
        meta(7, base_epoch=6),
        bucket("shards#01", 5, {A: "AFTER:50"}),  # before the reset (its tidying cut short)
        bucket("shards#02", 7, {B: "AFTER:2"}),
        entry(0, 5, 30, {C: "AFTER:9"}),
        entry(1, 7, 31, {A: "AFTER:1"}),
    ]
    assert positions(items) == {A: "AFTER:1", B: "AFTER:2"}
    assert slot_key(0) in read_items(items).ring.free()


def test_format_3_buckets_and_format_4_entries_fold_together():
    import json

    old = {**APP, "key": {"S": "shards#03"}, "version": {"N": "2"}, "epoch": {"N": "2"},
           "positions": {"S": json.dumps({"s/a": {"position": "AFTER:3", "epoch": 2,
                                                   "owner": "o", "committedAt": "t"}})}}
    assert positions([meta(3), old, entry(0, 3, 0, {B: "AFTER:4"})]) == {
        A: "AFTER:3", B: "AFTER:4"
    }


def test_a_full_ring_has_no_free_slot():
    items = [meta(2)] + [entry(i, 2, i, {A: f"AFTER:{i + 1}"}) for i in range(RING)]
    read = read_items(items)
    assert read.ring.free() == [] and positions(items) == {A: f"AFTER:{RING}"}


def test_format_1_items_written_before_a_reset_are_not_read():
    legacy = {**APP, "key": {"S": "shard#s#a"}, "position": {"S": "AFTER:99"}, "epoch": {"N": "3"}}
    assert positions([meta(6, base_epoch=5), legacy]) == {}
    assert positions([meta(6), legacy]) == {A: "AFTER:99"}
