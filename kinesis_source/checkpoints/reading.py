"""Reading one application's items, in every stored format, into what they mean: the meta
item, the committed positions (format 1's items, the buckets and format 4's log folded
together) and what a writer needs to go on writing them."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from kinesis_source.checkpoints.deltas import (
    LOG_PREFIX,
    RING,
    LogEntry,
    Ring,
    apply,
    shards_of_bucket,
    unpack,
)
from kinesis_source.checkpoints.format import (
    BUCKET_PREFIX,
    INITIAL_PREFIX,
    META_KEY,
    SHARD_PREFIX,
    SPEC_PREFIX,
    Meta,
    StoredShard,
    advances,
    bucket_key,
    from_ddb,
    shard_of_entry,
    shard_of_item_key,
)
from kinesis_source.checkpoints.sizing import item_bytes
from kinesis_source.positions import Offset, Position, ShardId


@dataclass
class ItemsRead:
    """One application's items as a query returned them, parsed: the meta item (its stored
    initial positions filled in from the ``initial#NN`` set it names), the committed
    positions, and what a writer needs to write on from them."""

    meta: Meta | None = None
    shards: dict[ShardId, StoredShard] = field(default_factory=dict)
    legacy_keys: list[str] = field(default_factory=list)  # format-1 items still there
    bucket_bytes: dict[str, int] = field(default_factory=dict)  # bucket sort key -> size
    initial_keys: set[str] = field(default_factory=set)  # every initial#NN item
    spec_keys: set[str] = field(default_factory=set)  # every spec#NNNN item
    ring: Ring = field(default_factory=Ring)
    log: list[LogEntry] = field(default_factory=list)  # the live log entries, oldest first
    meta_bytes: int = 0


def read_items(raw_items: Iterable[Mapping[str, dict]]) -> ItemsRead:
    """Parse the raw (attribute-value) items of one application."""
    out = ItemsRead()
    legacy: dict[ShardId, StoredShard] = {}
    initial: dict[str, dict[str, str]] = {}  # by initialId: offset key -> position
    specs: dict[str, dict[str, str]] = {}  # by initialSpecId: sort key -> text
    buckets: list[tuple[int, dict[ShardId, StoredShard]]] = []  # (epoch, shards)
    entries: list[tuple[LogEntry, int]] = []
    for raw in raw_items:
        item = from_ddb(raw)
        key = item["key"]
        if key == META_KEY:
            out.meta = Meta.from_item(item)
            out.meta_bytes = item_bytes(raw)
        elif key.startswith(BUCKET_PREFIX):
            out.bucket_bytes[key] = item_bytes(raw)
            if "packed" in item:  # format 4
                shards = shards_of_bucket(unpack(bytes(item["packed"])))
            else:
                shards = {
                    ShardId.parse(k): shard_of_entry(e)
                    for k, e in json.loads(item["positions"]).items()
                }
            buckets.append((int(item.get("epoch", 0)), shards))
        elif key.startswith(LOG_PREFIX):
            entries.append((LogEntry.from_item(item), item_bytes(raw)))
        elif key.startswith(INITIAL_PREFIX):
            out.initial_keys.add(key)
            initial.setdefault(item.get("initialId", ""), {}).update(json.loads(item["positions"]))
        elif key.startswith(SPEC_PREFIX):
            out.spec_keys.add(key)
            specs.setdefault(item.get("specId", ""), {})[key] = item["text"]
        elif key.startswith(SHARD_PREFIX):
            out.legacy_keys.append(key)
            legacy[shard_of_item_key(key)] = StoredShard(
                position=Position.parse(item["position"]),
                epoch=int(item.get("epoch", 0)),
                owner=item.get("owner"),
                committed_at=item.get("committedAt"),
            )
    meta = out.meta
    ring = out.ring
    if meta is not None:
        ring.mark, ring.base_epoch = meta.compacted_through, meta.base_epoch
    for epoch, shards in buckets:
        if epoch >= ring.base_epoch:  # else written before a reset
            out.shards.update(shards)
    for entry, size in entries:
        ring.taken(entry.slot, entry.seq, size)
    ring.next_slot = _after_newest(entries)
    out.log = sorted((e for e, _ in entries if ring.live(e.seq, e.epoch)), key=lambda e: e.seq)
    apply(out.shards, out.log)
    ring.dirty = {bucket_key(k) for e in out.log for k in (*e.positions, *e.dropped)}
    if meta is not None and meta.initial_id is not None:
        # The set the meta item names wins over format 2's inline offset, and items of any
        # other set (a save or a reset cut short) are not read.
        stored = initial.get(meta.initial_id, {})
        out.meta = meta = replace(
            meta, resolved=Offset({ShardId.parse(k): Position.parse(p) for k, p in stored.items()})
        )
    if meta is not None and meta.spec_id is not None:
        parts = specs.get(meta.spec_id, {})
        out.meta = replace(meta, initial_spec="".join(parts[k] for k in sorted(parts)) or None)
    for sid, old in legacy.items():
        # A migration cut short leaves both: the further one is the commit (unless a reset
        # since retired it, its tidying cut short).
        if old.epoch < ring.base_epoch:
            continue
        if sid not in out.shards or advances(old.position, out.shards[sid].position):
            out.shards[sid] = old
    return out


def _after_newest(entries: list[tuple[LogEntry, int]]) -> int:
    if not entries:
        return 0
    newest = max(entries, key=lambda pair: pair[0].seq)[0]
    return (int(newest.slot[len(LOG_PREFIX):]) + 1) % RING
