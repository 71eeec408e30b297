"""Format 4's writes: a commit as log entries in ring slots (one fenced transaction), and the
compaction that folds the log into the buckets when the ring runs out of free slots. Why any
interleaving of these is read right: ``deltas.py``."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from kinesis_source.aws.clients import error_code
from kinesis_source.checkpoints.deltas import (
    bucket_body,
    entry_body,
    pack,
    seq_text,
)
from kinesis_source.checkpoints.format import (
    MAX_ITEM_BYTES,
    META_KEY,
    StoredShard,
    advances,
    bucket_key,
    now_iso,
    order_key,
)
from kinesis_source.checkpoints.sizing import item_bytes, write_units
from kinesis_source.checkpoints.writes import FencedWriter
from kinesis_source.errors import CheckpointError
from kinesis_source.positions import Position, ShardId

# Compaction rewrites buckets with single conditional writes (half a transaction's cost), this
# many at once.
_PARALLEL_PUTS = 8
_WRU_ATTR = 12  # the bytes the "wru" attribute adds to an entry's item


@dataclass(frozen=True)
class Written:
    """What a write cost: ``TransactWriteItems``/``PutItem``/``UpdateItem`` calls, and write
    units by DynamoDB's sizing (as estimated here)."""

    calls: int = 0
    write_units: int = 0

    def __add__(self, other: Written) -> Written:
        return Written(self.calls + other.calls, self.write_units + other.write_units)


def changes(
    writer: FencedWriter,
    epoch: int,
    owner: str,
    positions: Mapping[ShardId, Position],
    forget: Iterable[ShardId],
) -> tuple[dict[ShardId, StoredShard], set[ShardId]]:
    """What a commit of ``positions`` (dropping the finished shards of ``forget``) changes in
    what the table holds; raises, writing nothing, if any position is behind the stored one."""
    known = writer.known_shards()
    for key, pos in positions.items():
        if order_key(pos) is None:
            raise ValueError(f"position {pos} of {key} is not a commit position")
    behind = sorted(
        str(k) for k, p in positions.items() if k in known and advances(known[k].position, p)
    )
    if behind:
        raise CheckpointError(
            f"Refused to move shard(s) {', '.join(behind)} of the {writer.where()} "
            "backwards: their stored positions are ahead of this commit (was the "
            "application reset while this query ran?)"
        )
    now = now_iso()
    changed = {
        k: StoredShard(p, epoch, owner, now)
        for k, p in positions.items()
        if k not in known or known[k].position != p
    }
    dropped = {
        k for k in forget
        if k not in positions and k in known and known[k].position.is_shard_end
    }
    return changed, dropped


def commit(
    writer: FencedWriter,
    epoch: int,
    owner: str,
    changed: Mapping[ShardId, StoredShard],
    dropped: Collection[ShardId],
) -> Written:
    """Write ``changed`` positions and ``dropped`` shards as log entries, fenced by ``epoch``,
    compacting first if the ring has too few free slots."""
    known = writer.known_shards()
    now = next(iter(changed.values())).committed_at if changed else None
    now = now or now_iso()
    pieces = _pieces(owner, now, changed, dropped)
    ring = writer.ring
    done = Written()
    if len(ring.free()) < len(pieces):
        done = compact(writer, epoch, now)
    slots = ring.free()
    if len(slots) < len(pieces):  # past 700,000 shards moved in one commit
        raise CheckpointError(f"A commit of {len(changed)} shards is too large for the {writer.where()}")
    units = write_units(writer.meta_bytes, transactional=True)  # the epoch check
    planned: dict[str, tuple[str, int, tuple[dict, frozenset]]] = {}
    writes = []
    for i, (blob, part) in enumerate(pieces):
        slot, seq = slots[i], seq_text(epoch, ring.last_n + 1 + i)
        item: dict[str, dict[str, Any]] = {
            **writer.key(slot), "seq": {"S": seq}, "epoch": {"N": str(epoch)},
            "packed": {"B": blob},
        }
        size = item_bytes(item) + _WRU_ATTR
        old = ring.slots.get(slot)
        units += write_units(max(size, old[1] if old else 0), transactional=True)
        put: dict[str, Any] = {"TableName": writer.table, "Item": item}
        if old is None:
            put["ConditionExpression"] = "attribute_not_exists(#k)"
            put["ExpressionAttributeNames"] = {"#k": "key"}
        else:
            put["ConditionExpression"] = "#s = :old"
            put["ExpressionAttributeNames"] = {"#s": "seq"}
            put["ExpressionAttributeValues"] = {":old": {"S": old[0]}}
        planned[slot] = (seq, size, part)
        writes.append((slot, {"Put": put}, len(blob)))
    # The whole commit's units on its first entry: `kinesis-ddb status` shows them.
    writes[0][1]["Put"]["Item"]["wru"] = {"N": str(units)}

    def written(names: list[str]) -> None:
        for slot in names:
            seq, size, (positions, gone) = planned[slot]
            ring.taken(slot, seq, size)
            for sid in positions:
                known[sid] = changed[sid]
            for sid in gone:
                known.pop(sid, None)
            ring.dirty.update(bucket_key(k) for k in (*positions, *gone))

    calls = writer.run(epoch, writes, written)
    writer.last_commit_units = units
    return done + Written(calls, units)


def _pieces(
    owner: str, now: str, changed: Mapping[ShardId, StoredShard], dropped: Collection[ShardId]
) -> list[tuple[bytes, tuple[dict, frozenset]]]:
    """The packed log items of one commit: one, unless it exceeds an item's size (thousands of
    shards moved at once), then halves until each fits."""
    todo = [(dict(changed), frozenset(dropped))]
    out = []
    while todo:
        part, gone = todo.pop()
        blob = pack(entry_body(owner, now, {k: s.position for k, s in part.items()}, gone))
        if len(blob) <= MAX_ITEM_BYTES or len(part) + len(gone) <= 1:
            out.append((blob, (part, gone)))
            continue
        if len(part) <= 1:  # the dropped shards alone are too many for an item: halve them
            dropped_keys = sorted(gone, key=str)
            todo.append((part, frozenset(dropped_keys[len(dropped_keys) // 2:])))
            todo.append(({}, frozenset(dropped_keys[: len(dropped_keys) // 2])))
            continue
        keys = sorted(part, key=str)
        half = len(keys) // 2
        todo.append(({k: part[k] for k in keys[half:]}, frozenset()))
        todo.append(({k: part[k] for k in keys[:half]}, gone))
    return out


def compact(writer: FencedWriter, epoch: int, now: str) -> Written:
    """Rewrite every bucket the live log entries touched from what is known here, then mark
    those entries as held by the buckets (their slots are free again)."""
    known = writer.known_shards()
    ring = writer.ring
    grouped: dict[str, dict[ShardId, StoredShard]] = {b: {} for b in ring.dirty}
    for sid, shard in known.items():
        if bucket_key(sid) in grouped:
            grouped[bucket_key(sid)][sid] = shard
    units = 0
    requests = []
    for bucket in sorted(grouped):
        request: dict[str, Any] = {
            "TableName": writer.table,
            "Key": writer.key(bucket),
            # Never over a bucket of a newer epoch: a fenced query's late compaction is refused.
            "ConditionExpression": "attribute_not_exists(#k) OR epoch <= :e",
            "ExpressionAttributeNames": {"#k": "key"},
            "ExpressionAttributeValues": {":e": {"N": str(epoch)}},
        }
        old = writer.bucket_bytes.get(bucket, 0)
        # A bucket whose shards all left is written empty, not deleted: its epoch keeps a fenced
        # query's late compaction from writing the dropped shards back into it.
        blob = pack(bucket_body(grouped[bucket]))
        if len(blob) > MAX_ITEM_BYTES:
            raise CheckpointError(
                f"The positions of the {writer.where()} no longer fit DynamoDB items "
                f"({len(known)} shards): read fewer streams per application"
            )
        item = {
            **request.pop("Key"), "packed": {"B": blob}, "epoch": {"N": str(epoch)},
            "committedAt": {"S": now},
        }
        request["Item"] = item
        size = item_bytes(item)
        units += write_units(max(size, old))
        requests.append((bucket, "put_item", request, size))
    with ThreadPoolExecutor(max(1, min(_PARALLEL_PUTS, len(requests)))) as pool:
        outcomes = list(pool.map(lambda r: _send(writer, r), requests))
    refused = [bucket for (bucket, _, _, _), ok in zip(requests, outcomes, strict=True) if not ok]
    for (bucket, _, _, size), ok in zip(requests, outcomes, strict=True):
        if ok:
            writer.bucket_bytes[bucket] = size
    if refused:
        _refused(writer, epoch, refused)
    calls = len(requests)
    live = [seq for seq, _ in ring.slots.values() if ring.live(seq, int(seq.partition(".")[0]))]
    if live:
        mark = max(live)
        units += write_units(writer.meta_bytes)
        _mark(writer, epoch, mark, now, units)
        calls += 1
        ring.mark = mark
    ring.dirty = set()
    writer.last_compaction_units = units
    return Written(calls, units)


def _send(writer: FencedWriter, request: tuple[str, str, dict, int]) -> bool:
    _, operation, params, _ = request
    try:
        getattr(writer.client, operation)(**params)
    except ClientError as exc:
        if error_code(exc) != "ConditionalCheckFailedException":
            raise
        return False
    return True


def _refused(writer: FencedWriter, epoch: int, buckets: list[str]) -> None:
    meta = writer.client.get_item(
        TableName=writer.table, Key=writer.key(META_KEY), ConsistentRead=True
    ).get("Item", {})
    if int(meta.get("epoch", {}).get("N", "0")) != epoch:
        raise writer.fenced(epoch)
    raise writer.foreign(buckets, "those buckets were not rewritten")


def _mark(writer: FencedWriter, epoch: int, mark: str, now: str, units: int) -> None:
    try:
        writer.client.update_item(
            TableName=writer.table,
            Key=writer.key(META_KEY),
            UpdateExpression="SET compactedThrough = :m, compactedAt = :t, compactedWru = :u",
            ConditionExpression="epoch = :e",
            ExpressionAttributeValues={
                ":m": {"S": mark}, ":t": {"S": now}, ":u": {"N": str(units)},
                ":e": {"N": str(epoch)},
            },
        )
    except ClientError as exc:
        if error_code(exc) == "ConditionalCheckFailedException":
            raise writer.fenced(epoch) from None
        raise
