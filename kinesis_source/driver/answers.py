"""``latestOffset`` in time proportional to the shards that changed.

Spark asks for the next end many times a second, and at 1,000 shards an answer rebuilt from
the whole listing and tip table costs milliseconds of Python per call. Between two calls little
changes: Spark's next start is the end handed out last (or the same start again), the listing
is the same object until discovery finds a new one, and the tip table records which shards
changed (:meth:`~kinesis_source.driver.tips.TipTable.take_changed`). :class:`LastAnswer`
keeps what the last full answer was computed from and re-answers only those shards.

Anything rarer than a new record (a new listing, a shard that ended or went away, a shard the
table must probe first, a finished shard to retire) falls back to the full computation, so the
patched answer is always the one the full computation would give.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kinesis_source.aws.kinesis import ShardInfo
from kinesis_source.driver.handout import HandOut
from kinesis_source.driver.probe import ProbeResult
from kinesis_source.driver.tips import TipTable
from kinesis_source.positions import Offset, Position, ShardId


def lag_entry(result: ProbeResult) -> dict:
    """One shard's row of the progress report's lag."""
    return {"tip": result.tip, "millisBehindLatest": result.behind_ms}


@dataclass
class LastAnswer:
    """One full ``latestOffset`` answer and what it was computed from."""

    start: Offset
    end: Offset
    listing: Mapping[str, list[ShardInfo]]  # the object planned on: a new listing is a new one
    starts: dict[ShardId, Position]  # where each tracked shard's end was looked for
    moved: set[ShardId] = field(default_factory=set)  # shards whose end is past their start
    lag: dict[str, dict] = field(default_factory=dict)
    held: set[ShardId] = field(default_factory=set)  # new records kept for a later batch (budget)

    @staticmethod
    def of(
        start: Offset,
        end: Offset,
        listing: Mapping[str, list[ShardInfo]],
        starts: dict[ShardId, Position],
        results: Mapping[ShardId, ProbeResult],
        lag: dict[str, dict],
    ) -> LastAnswer | None:
        """The state to patch later answers from, or None when the answer holds something only
        the full computation handles (a shard that ended or went away, a shard that left or
        joined the offset)."""
        if any(r.ended or r.gone for r in results.values()):
            return None
        if end.shards.keys() != start.shards.keys():
            return None
        moved = {sid for sid in results if end.shards[sid] is not start.shards[sid]}
        held = {sid for sid, r in results.items() if r.tip is not None and sid not in moved}
        return LastAnswer(start, end, listing, starts, moved, lag, held)

    def patch(
        self,
        start: Offset,
        listing: Mapping[str, list[ShardInfo]],
        tips: TipTable,
        handout: HandOut,
    ) -> Offset | None:
        """The end for ``start`` if it can be derived from this answer (``start`` is this
        answer's start or end, the listing is the same, and each changed shard's table entry
        covers its start and neither ended nor went away), else None. A shard whose records
        ``handout`` holds for a later batch keeps its start (and is looked at again next time). Updates this state
        to the new answer, in place: after a None, this state must be dropped (the caller then
        computes in full), so nothing is copied that a failed patch would have to keep."""
        if listing is not self.listing:
            return None
        starts = self.starts
        if start is self.start:
            redo, base = tips.take_changed() | self.held, self.end
            moved = self.moved
        elif start is self.end:
            redo, base = tips.take_changed() | self.moved | self.held, start
            for sid in self.moved:
                starts[sid] = start.shards[sid]
            moved = set()
        else:
            return None
        changes: dict[ShardId, Position] = {}
        waiting: set[ShardId] = set()
        lag = self.lag
        for sid in redo:
            at = starts.get(sid)
            if at is None:
                continue  # not tracked (finished or waiting for its parents)
            if at.is_shard_end:
                return None
            result = tips.covered(sid, at)
            if result is None or result.ended or result.gone:
                return None
            lag[str(sid)] = lag_entry(result)
            if result.tip is not None and not handout.held(sid, at):
                changes[sid] = Position.after(result.tip)
                moved.add(sid)
            else:
                if result.tip is not None:
                    waiting.add(sid)
                changes[sid] = start.shards[sid]
                moved.discard(sid)
        end = base.with_changes({sid: p for sid, p in changes.items() if base.shards.get(sid) is not p})
        self.start, self.end, self.starts, self.moved, self.lag = start, end, starts, moved, lag
        self.held = waiting
        return end
