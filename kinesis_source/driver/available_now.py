"""``Trigger.AvailableNow``: the target a run reads up to, fixed when it starts."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

from kinesis_source.aws.kinesis import ShardInfo
from kinesis_source.driver.probe import SETTLE_TIMEOUT_S, ProbeResult, TailProber, settle_all
from kinesis_source.errors import KinesisSourceError
from kinesis_source.positions import AFTER, Position, ShardId, seq_key


@dataclass(frozen=True)
class Target:
    """What a ``Trigger.AvailableNow`` run reads: the data in the stream when it started.

    ``found`` holds what the probe found from ``TRIM_HORIZON`` in each shard open at that
    moment: its newest record then is the shard's cap (:attr:`caps`; None if it had none), and
    the tip table's first answers start from it (``TipTable.seed``). Shards closed then are
    read to their end. A shard created later holds only records that arrived after the start,
    so it is not read at all.
    """

    found: Mapping[ShardId, ProbeResult]
    closed: frozenset[ShardId]

    @functools.cached_property
    def caps(self) -> dict[ShardId, str | None]:
        """Each shard open at the start and its newest record then (None: it had none)."""
        return {sid: result.tip for sid, result in self.found.items()}

    def arrival(self, key: ShardId, seq: str) -> float | None:
        """When ``seq`` arrived (epoch seconds, the server's clock), if it is ``key``'s cap and
        the probe saw its arrival."""
        result = self.found.get(key)
        return result.tip_at if result is not None and result.tip == seq else None

    def bound(
        self, starts: dict[ShardId, Position]
    ) -> tuple[dict[ShardId, Position], dict[ShardId, str]]:
        """The shards of ``starts`` with records left within the target, and their caps."""
        kept: dict[ShardId, Position] = {}
        caps: dict[ShardId, str] = {}
        for sid, pos in starts.items():
            if sid in self.closed:
                kept[sid] = pos
                continue
            cap = self.caps.get(sid)
            if cap is None:
                continue
            if pos.kind == AFTER and _past(pos, cap):
                continue
            kept[sid], caps[sid] = pos, cap
        return kept, caps


def _past(pos: Position, cap: str) -> bool:
    """True when nothing up to ``cap`` is left after the ``AFTER`` position ``pos`` (inside an
    aggregate, the rest of the record ``cap`` itself may still be)."""
    assert pos.seq is not None
    if pos.sub_seq is not None:
        return seq_key(pos.seq) > seq_key(cap)
    return seq_key(pos.seq) >= seq_key(cap)


async def find_target(listing: Mapping[str, list[ShardInfo]], prober: TailProber) -> Target:
    """Every open shard's newest record now (probed from TRIM_HORIZON, across empty pages)."""
    open_shards = {
        ShardId(stream, s.shard_id): Position.trim_horizon()
        for stream, shards in listing.items()
        for s in shards
        if not s.is_closed
    }
    results = await settle_all(prober, open_shards)
    unsettled = sorted(str(sid) for sid, r in results.items() if r.pending)
    if unsettled:
        raise KinesisSourceError(
            f"Trigger.AvailableNow cannot fix its target: Kinesis served only empty pages "
            f"for shard(s) {', '.join(unsettled)} for {SETTLE_TIMEOUT_S:g} s, so their newest "
            "record is unknown. Start the query again (the next probe goes on from there)."
        )
    closed = frozenset(
        ShardId(stream, s.shard_id) for stream, shards in listing.items() for s in shards if s.is_closed
    )
    return Target(results, closed)
