"""The stored format of the checkpoint table: item keys, buckets, the order of positions, and
the items' (de)serialisation. See ``store.py`` for the protocol.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from kinesis_source.positions import AFTER, AT, SHARD_END, Offset, Position, ShardId

FORMAT_VERSION = 4


META_KEY = "meta"


SHARD_PREFIX = "shard#"  # format 1


BUCKET_PREFIX = "shards#"


INITIAL_PREFIX = "initial#"  # format 3
SPEC_PREFIX = "spec#"  # format 3: an initial position spec too large for the meta item
# A spec longer than this (a per-shard JSON, as `checkpoints export` writes) is kept in
# spec#NNNN items of SPEC_CHUNK characters, named by the meta item: every commit's epoch check
# costs write units by the meta item's size (two per KB started), so the meta item stays small.
MAX_INLINE_SPEC = 500
SPEC_CHUNK = 300_000


# Fixed since format 2 (changing it moves shards between items: a new format). 64 keeps a small
# application's commit as small as before (one short item per shard) and a 1,000-shard commit
# within one transaction.
BUCKETS = 64


MAX_TRANSACT_ITEMS = 100  # DynamoDB's limit per TransactWriteItems


MAX_TRANSACT_BYTES = 3_500_000  # DynamoDB's limit is 4 MB per transaction


MAX_ITEM_BYTES = 380_000  # DynamoDB's limit is 400 KB per item


_SEQ_WIDTH = 128  # sequence numbers are at most 128 digits


def item_key(sid: ShardId) -> str:
    """Sort key of a shard's item: ``shard#<stream>#<shardId>``."""
    return f"{SHARD_PREFIX}{sid.stream}#{sid.shard}"


def shard_of_item_key(item_sort_key: str) -> ShardId:
    """Inverse of :func:`item_key`."""
    stream, _, shard_id = item_sort_key[len(SHARD_PREFIX) :].partition("#")
    return ShardId(stream, shard_id)


def bucket_key(sid: ShardId) -> str:
    """Sort key of the item holding a shard's position: ``shards#NN``, by CRC32 (stable across
    processes and Python versions, unlike ``hash``)."""
    return f"{BUCKET_PREFIX}{_bucket_number(sid):02d}"


def initial_bucket_key(sid: ShardId) -> str:
    """Sort key of the item holding a shard's stored initial position: ``initial#NN``, ``NN``
    as in its :func:`bucket_key`."""
    return f"{INITIAL_PREFIX}{_bucket_number(sid):02d}"


def _bucket_number(sid: ShardId) -> int:
    # of the text "<stream>/<shardId>": the bucket a shard is in is part of the stored format
    return zlib.crc32(str(sid).encode()) % BUCKETS


def order_key(pos: Position) -> str | None:
    """A string whose byte order is the order of committed positions within one shard.

    Only positions after a record can be committed (TRIM_HORIZON and AT_TIMESTAMP are starting
    points, not progress): ``AT:s`` < ``AFTER:s:sub`` < ``AFTER:s`` < ``SHARD_END``.
    """
    if pos.kind == SHARD_END:
        return "~"
    if pos.kind == AT:
        return f"{int(pos.seq):0{_SEQ_WIDTH}d}a"  # type: ignore[arg-type]
    if pos.kind == AFTER:
        if pos.sub_seq is not None:
            return f"{int(pos.seq):0{_SEQ_WIDTH}d}b{pos.sub_seq:020d}"  # type: ignore[arg-type]
        return f"{int(pos.seq):0{_SEQ_WIDTH}d}c"  # type: ignore[arg-type]
    return None


def advances(new: Position, old: Position | None) -> bool:
    """True when committing ``new`` over ``old`` moves the shard forward."""
    new_order = order_key(new)
    if new_order is None:
        return False
    old_order = order_key(old) if old is not None else None
    return old_order is None or new_order > old_order


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class Meta:
    """The application's meta item.

    ``resolved`` (the stored initial positions, None when none are stored) is complete only in
    :meth:`CheckpointStore.snapshot`, which reads the ``initial#NN`` items named by
    ``initial_id``; parsed from the meta item alone it holds only format 2's inline offset.
    """

    epoch: int = 0
    owner: str | None = None
    owner_host: str | None = None
    claimed_at: str | None = None
    format_version: int = FORMAT_VERSION
    streams: Mapping[str, str] = field(default_factory=dict)
    initial_spec: str | None = None
    resolved: Offset | None = None
    initial_id: str | None = None
    spec_id: str | None = None  # names the spec#NNNN items holding a long initial_spec
    compacted_through: str | None = None  # format 4: the last log entry the buckets hold
    base_epoch: int = 0  # format 4: items of an earlier epoch predate a reset
    compacted_at: str | None = None
    compacted_write_units: int = 0  # of the last compaction

    @staticmethod
    def from_item(item: Mapping[str, Any]) -> Meta:
        """Parse a meta item (as the resource-less client returns it, already plain)."""
        resolved = item.get("resolved")  # format 2
        return Meta(
            epoch=int(item.get("epoch", 0)),
            owner=item.get("owner"),
            owner_host=item.get("ownerHost"),
            claimed_at=item.get("claimedAt"),
            format_version=int(item.get("formatVersion", FORMAT_VERSION)),
            streams=json.loads(item["streams"]) if item.get("streams") else {},
            initial_spec=item.get("initialSpec"),
            resolved=Offset.from_json(resolved) if resolved else None,
            initial_id=item.get("initialId"),
            spec_id=item.get("initialSpecId"),
            compacted_through=item.get("compactedThrough"),
            base_epoch=int(item.get("baseEpoch", 0)),
            compacted_at=item.get("compactedAt"),
            compacted_write_units=int(item.get("compactedWru", 0)),
        )


@dataclass(frozen=True)
class StoredShard:
    """One shard's committed item."""

    position: Position
    epoch: int
    owner: str | None
    committed_at: str | None


@dataclass(frozen=True)
class Snapshot:
    """Everything stored for one application."""

    meta: Meta | None
    shards: Mapping[ShardId, StoredShard]
    legacy: frozenset[str] = frozenset()  # sort keys of format-1 items still in the table
    log: tuple[Any, ...] = ()  # format 4's live log entries (deltas.LogEntry), oldest first

    def positions(self) -> dict[ShardId, Position]:
        """Committed positions by shard."""
        return {k: s.position for k, s in self.shards.items()}


def _plain(value: dict) -> Any:
    """DynamoDB attribute value to Python (the subset this store writes)."""
    (kind, raw), = value.items()
    if kind == "N":
        return int(raw)
    return raw


def from_ddb(item: Mapping[str, dict]) -> dict[str, Any]:
    return {k: _plain(v) for k, v in item.items()}


def entry_of(shard: StoredShard) -> dict[str, Any]:
    return {
        "committedAt": shard.committed_at,
        "epoch": shard.epoch,
        "owner": shard.owner,
        "position": shard.position.to_str(),
    }


def shard_of_entry(entry: Mapping[str, Any]) -> StoredShard:
    return StoredShard(
        position=Position.parse(entry["position"]),
        epoch=int(entry.get("epoch", 0)),
        owner=entry.get("owner"),
        committed_at=entry.get("committedAt"),
    )


def transactions(writes: list[tuple[str, dict, int]]) -> list[list[tuple[str, dict, int]]]:
    """Consecutive runs of writes within one transaction's limits (one item is the check)."""
    chunks: list[list[tuple[str, dict, int]]] = []
    size = 0
    for write in writes:
        if not chunks or len(chunks[-1]) == MAX_TRANSACT_ITEMS - 1 or size + write[2] > MAX_TRANSACT_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(write)
        size += write[2]
    return chunks
