"""Pure functions over the shard graph: which shards to read now, which have left the offset.

Resharding closes shards and opens children (a split: two children of one parent; a merge: one
child of two parents). Records of one partition key move from parent to child, so a child is
read only after every parent is at ``SHARD_END`` in a committed batch (the ``start`` offset):
parent before child, as KCL and Flink do.

A closed shard at ``SHARD_END`` leaves the offset once all its children are in it, so the offset
does not grow across reshards. A shard that is listed but not in the offset is then either
finished (one of its descendants is in the offset) or new (none is): only new shards start, at
``TRIM_HORIZON``, once eligible.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from kinesis_source.aws.kinesis import ShardInfo
from kinesis_source.positions import Position, ShardId


def _parents(shard: ShardInfo) -> list[str]:
    return [p for p in (shard.parent, shard.adjacent_parent) if p]


def _children(shards: list[ShardInfo]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for shard in shards:
        for parent in _parents(shard):
            out.setdefault(parent, []).append(shard.shard_id)
    return out


def _has_tracked_descendant(
    shard_id: str, children: dict[str, list[str]], tracked: set[str]
) -> bool:
    todo, seen = list(children.get(shard_id, [])), set()
    while todo:
        child = todo.pop()
        if child in seen:
            continue
        seen.add(child)
        if child in tracked:
            return True
        todo.extend(children.get(child, []))
    return False


def _finished(
    shard_id: str,
    by_id: dict[str, ShardInfo],
    children: dict[str, list[str]],
    stream: str,
    positions: Mapping[ShardId, Position],
) -> bool:
    """True when every record of ``shard_id`` is behind the committed positions."""
    pos = positions.get(ShardId(stream, shard_id))
    if pos is not None:
        return pos.is_shard_end
    if shard_id not in by_id:
        return True  # expired or never known: nothing of it is left to read
    tracked = {k for k in by_id if ShardId(stream, k) in positions}
    return _has_tracked_descendant(shard_id, children, tracked)


def probe_starts(
    listing: Mapping[str, list[ShardInfo]], start: Mapping[ShardId, Position]
) -> dict[ShardId, Position]:
    """The shards to probe for the next batch, and the position each one starts at.

    A shard is read only once all its parents are finished. Tracked shards continue from their
    position (unless at ``SHARD_END``); an untracked new shard starts at ``TRIM_HORIZON``.
    """
    out: dict[ShardId, Position] = {}
    for stream, shards in listing.items():
        by_id = {s.shard_id: s for s in shards}
        children = _children(shards)
        tracked = {s.shard_id for s in shards if ShardId(stream, s.shard_id) in start}
        for shard in shards:
            sid = ShardId(stream, shard.shard_id)
            pos = start.get(sid)
            if pos is not None and pos.is_shard_end:
                continue
            if pos is None and _has_tracked_descendant(shard.shard_id, children, tracked):
                continue  # finished and retired from the offset
            if all(_finished(p, by_id, children, stream, start) for p in _parents(shard)):
                out[sid] = pos or Position.trim_horizon()
    return out


def retire_finished(
    listing: Mapping[str, list[ShardInfo]],
    positions: Mapping[ShardId, Position],
    committed: Mapping[ShardId, Position],
) -> dict[ShardId, Position]:
    """``positions`` (a batch's end) without the shards at ``SHARD_END`` whose children are
    all tracked, and without shards at ``SHARD_END`` that are no longer listed.

    Only shards already at ``SHARD_END`` in ``committed`` (the batch's start) leave: a shard
    that ends in this batch stays in its end offset, so the commit of the batch writes its
    ``SHARD_END`` to DynamoDB (with its children tracked from the initial offset, it would
    otherwise leave the offset before its end was ever committed, and a resume from DynamoDB
    would find it unfinished)."""
    listed = {stream: {s.shard_id for s in shards} for stream, shards in listing.items()}
    children = {stream: _children(shards) for stream, shards in listing.items()}
    out = dict(positions)
    for key, pos in positions.items():
        stream, shard_id = key
        before = committed.get(key)
        if not pos.is_shard_end or before is None or not before.is_shard_end:
            continue
        if stream not in listing:
            continue
        kids = children[stream].get(shard_id, [])
        if shard_id not in listed[stream] or (
            kids and all(ShardId(stream, c) in positions for c in kids)
        ):
            del out[key]
    return out


def gone_shards(
    listing: Mapping[str, list[ShardInfo]], positions: Mapping[ShardId, Position]
) -> list[ShardId]:
    """Tracked shards not read to their end that the listing no longer has (expired past
    retention, or deleted with their stream): their unread records are lost."""
    listed = {ShardId(st, s.shard_id) for st, shards in listing.items() for s in shards}
    return sorted(
        (
            key
            for key, pos in positions.items()
            if not pos.is_shard_end and key not in listed and key.stream in listing
        ),
        key=str,
    )


def droppable(
    listing: Mapping[str, list[ShardInfo]],
    committed: Mapping[ShardId, Position],
    candidates: Iterable[ShardId],
) -> list[ShardId]:
    """The ``candidates`` (finished shards) a resume from ``committed`` alone still finds
    finished: shards no longer listed, and shards with a committed child (then
    :func:`probe_starts` sees a tracked descendant, and the other children start where they
    would after the parent). A shard none of whose children is committed yet (an empty child is
    never committed) must stay, or it would be read again."""
    graphs: dict[str, tuple[set[str], dict[str, list[str]]]] = {}
    out = []
    for key in candidates:
        stream, shard_id = key
        shards = listing.get(stream)
        if not shards:  # not listed yet, or the stream is missing: nothing is known
            continue
        if stream not in graphs:
            graphs[stream] = ({s.shard_id for s in shards}, _children(shards))
        listed, children = graphs[stream]
        kids = children.get(shard_id, [])
        if shard_id not in listed or any(ShardId(stream, c) in committed for c in kids):
            out.append(key)
    return sorted(out, key=str)


def superseded(
    listing: Mapping[str, list[ShardInfo]], tracked: Collection[ShardId]
) -> set[ShardId]:
    """Listed shards not in ``tracked`` that have a descendant in it: finished, by the rule
    :func:`probe_starts` applies (a child is read only after its parents)."""
    out = set()
    for stream, shards in listing.items():
        children = _children(shards)
        ids = {s.shard_id for s in shards if ShardId(stream, s.shard_id) in tracked}
        for shard in shards:
            key = ShardId(stream, shard.shard_id)
            if key not in tracked and _has_tracked_descendant(shard.shard_id, children, ids):
                out.add(key)
    return out
