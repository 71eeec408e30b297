"""Format 4's commit log: each commit is one small item holding only the shards that moved.

A commit writes the positions that moved (and the finished shards it drops) into one
``log#NN`` item, a slot of a ring of :data:`RING`, in a transaction fenced by the epoch. The
``shards#NN`` buckets are the base the log applies to; a *compaction* rewrites the buckets the
log touched and then records, in the meta item, the last log entry they hold
(``compactedThrough``). A slot whose entry is at or before that mark is free again, so the log
never grows and nothing is deleted (a deletion costs as much as a write; an overwrite costs the
larger of the two items).

Reading is a fold: the base buckets, then every log entry after the mark, in order; a position
is taken only if it moves its shard forward and a dropped shard is removed. That makes every
state a reader can meet correct without a transaction around the compaction: buckets half
rewritten (the log entries they hold apply again and change nothing), a compaction whose mark
was never written, or a fenced query's buckets written late (they hold only what that query had
committed). Items of an epoch before ``baseEpoch`` (set by a reset) are not read, so a reset
takes effect at once, whatever its tidying-up leaves behind.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kinesis_source.checkpoints.format import (
    StoredShard,
    advances,
    entry_of,
    shard_of_entry,
)
from kinesis_source.positions import Position, ShardId

LOG_PREFIX = "log#"

# Slots in the ring: a compaction is due when a commit finds too few free. 64 makes a compaction
# (rewriting the touched buckets) cost a few percent of the commits between two of them, and a
# resume reads at most 64 small items besides the buckets.
RING = 64

_SEQ_DIGITS = 12


def slot_key(index: int) -> str:
    """Sort key of a ring slot: ``log#NN``."""
    return f"{LOG_PREFIX}{index:02d}"


def seq_text(epoch: int, n: int) -> str:
    """A log entry's place in the log, as text whose order is the log's: ``<epoch>.<n>``."""
    return f"{epoch:0{_SEQ_DIGITS}d}.{n:0{_SEQ_DIGITS}d}"


def pack(value: Any) -> bytes:
    """Canonical JSON, deflated: what a packed item's ``packed`` attribute holds."""
    return zlib.compress(json.dumps(value, sort_keys=True, separators=(",", ":")).encode(), 6)


def unpack(blob: bytes) -> Any:
    """Inverse of :func:`pack`."""
    return json.loads(zlib.decompress(blob))


@dataclass(frozen=True)
class LogEntry:
    """One commit as its log item holds it."""

    slot: str
    seq: str
    epoch: int
    owner: str | None
    committed_at: str | None
    positions: Mapping[ShardId, Position]
    dropped: frozenset[ShardId]
    write_units: int  # the commit's DynamoDB write units, as the writer sized its items

    @staticmethod
    def from_item(item: Mapping[str, Any]) -> LogEntry:
        """Parse a ``log#NN`` item (plain values, ``packed`` as bytes)."""
        body = unpack(bytes(item["packed"]))
        return LogEntry(
            slot=item["key"],
            seq=item["seq"],
            epoch=int(item.get("epoch", 0)),
            owner=body.get("owner"),
            committed_at=body.get("at"),
            positions={ShardId.parse(k): Position.parse(p) for k, p in body["positions"].items()},
            dropped=frozenset(ShardId.parse(k) for k in body.get("dropped", [])),
            write_units=int(item.get("wru", 0)),
        )

    @property
    def n(self) -> int:
        """The entry's number within the log."""
        return int(self.seq.partition(".")[2])


def entry_body(
    owner: str, now: str, positions: Mapping[ShardId, Position], dropped: Iterable[ShardId]
) -> dict[str, Any]:
    """What one log item holds: the moved positions and dropped shards of (part of) a commit."""
    return {
        "at": now,
        "dropped": sorted(str(k) for k in dropped),
        "owner": owner,
        "positions": {str(k): p.to_str() for k, p in positions.items()},
    }


def apply(shards: dict[ShardId, StoredShard], entries: Iterable[LogEntry]) -> None:
    """Fold log entries, oldest first, over base positions: a position only moves a shard
    forward (an entry the base already holds changes nothing), a dropped shard goes."""
    for entry in entries:
        for sid, pos in entry.positions.items():
            old = shards.get(sid)
            if old is None or advances(pos, old.position):
                shards[sid] = StoredShard(pos, entry.epoch, entry.owner, entry.committed_at)
        for sid in entry.dropped:
            shards.pop(sid, None)


def bucket_body(shards: Mapping[ShardId, StoredShard]) -> dict[str, Any]:
    """What a packed bucket holds: each shard's entry, as format 2's JSON did."""
    return {str(k): entry_of(s) for k, s in shards.items()}


def shards_of_bucket(body: Mapping[str, Any]) -> dict[ShardId, StoredShard]:
    """Inverse of :func:`bucket_body`."""
    return {ShardId.parse(k): shard_of_entry(e) for k, e in body.items()}


@dataclass
class Ring:
    """What the writer knows of the log: each slot's entry, the compaction mark, the buckets
    entries after the mark touched, and the items' sizes its write-unit figures need."""

    slots: dict[str, tuple[str, int]] = field(default_factory=dict)  # slot -> (seq, bytes)
    mark: str | None = None  # compactedThrough
    base_epoch: int = 0
    last_n: int = -1
    dirty: set[str] = field(default_factory=set)  # bucket keys the live entries touched
    next_slot: int = 0

    def live(self, seq: str, epoch: int) -> bool:
        """True for an entry a reader applies: after the mark, not before a reset."""
        return epoch >= self.base_epoch and (self.mark is None or seq > self.mark)

    def free(self) -> list[str]:
        """Free slots, in the order they are taken (round the ring from the last one used)."""
        order = [slot_key((self.next_slot + i) % RING) for i in range(RING)]
        return [s for s in order if s not in self.slots or not self._live_slot(s)]

    def _live_slot(self, slot: str) -> bool:
        seq, _ = self.slots[slot]
        return self.live(seq, int(seq.partition(".")[0]))

    def live_entries(self) -> int:
        """Slots holding entries a reader applies."""
        return sum(1 for s in self.slots if self._live_slot(s))

    def taken(self, slot: str, seq: str, size: int) -> None:
        """Record a slot written with entry ``seq`` of ``size`` bytes."""
        self.slots[slot] = (seq, size)
        self.last_n = max(self.last_n, int(seq.partition(".")[2]))
        self.next_slot = (int(slot[len(LOG_PREFIX):]) + 1) % RING
