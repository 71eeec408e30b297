"""Answering ``latestOffset``: the exact end of the next batch.

Spark's thread asks. In steady state the answer is the last one patched with the shards whose
view changed (``driver/answers.py``), computed in Spark's thread from the shards' records under
their lock: no AWS call, no wait for the planner's loop (at 1,000 shards the loop is busy with
probes, a few ms of CPU each, and an answer queued behind them waited for them). Anything
rarer (the first answer, a new listing, a shard that ended, a read limit, AvailableNow) is
computed in full on the loop (:meth:`LatestOffsets.full`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

from kinesis_source.aws.kinesis import AsyncKinesis
from kinesis_source.driver.answers import LastAnswer, lag_entry
from kinesis_source.driver.available_now import Target
from kinesis_source.driver.handout import HandOut
from kinesis_source.driver.limits import BudgetPlanner
from kinesis_source.driver.listing import ShardListing
from kinesis_source.driver.probe import SETTLE_PAUSE_S, SETTLE_TIMEOUT_S, ProbeResult, TailProber
from kinesis_source.driver.runtime import LoopThread
from kinesis_source.driver.tips import TipTable
from kinesis_source.errors import report_shard_gone
from kinesis_source.lineage import gone_shards, probe_starts, retire_finished
from kinesis_source.options import SourceOptions
from kinesis_source.positions import Offset, Position, ShardId

# How long the first answer for newly tracked shards waits for their first probe.
FIRST_PROBE_TIMEOUT_S = 60.0
# Under Trigger.AvailableNow, how long a batch waits for the table between looks.
TARGET_WAIT_S = 0.5


class LatestOffsets:
    """The ``latestOffset`` answers of one query run, and what the next is patched from."""

    def __init__(self, opts: SourceOptions, loop: LoopThread, kinesis: AsyncKinesis, listing: ShardListing,
                 prober: TailProber, tips: TipTable, handout: HandOut) -> None:
        self._opts = opts
        self._loop = loop
        self._kinesis = kinesis
        self._listing = listing
        self._prober = prober
        self._tips = tips
        self._handout = handout
        self.last: LastAnswer | None = None  # what the next answer may be patched from
        self.lag: dict[str, dict] = {}  # by "<stream>/<shardId>": Spark shows it as JSON
        self.target: Target | None = None  # Trigger.AvailableNow's, once fixed
        self._turn = 0  # rotates which shard a limited batch serves first
        self.answers = 0

    def patched(self, start: Offset, max_records: int | None) -> Offset | None:
        """The end derived from the last answer, or None when only :meth:`full` can answer
        (Spark's thread: the views are read under the shards' lock; what only the loop may do,
        scheduling probes, is posted to it)."""
        listing = self._listing.current()
        if max_records is not None or self.target is not None or self.last is None or listing is None:
            return None
        self._loop.post(self._tips.batch_over)
        self._tips.raise_error()
        last = self.last
        end = last.patch(start, listing, self._tips, self._handout)
        if end is not None:
            self.answers += 1
            if last.held:
                held = frozenset(last.held)
                self._loop.post(lambda: self._tips.hold_all(held))
        return end

    async def full(self, start: Offset, max_records: int | None) -> Offset:
        """The end computed from the listing and every shard's view (on the loop)."""
        listing = await self._listing.get()
        self._tips.batch_over()
        self.last = None  # (its patch was tried first, and it took the table's changes)
        positions = dict(start.shards)
        for sid in gone_shards(listing, start.shards):
            report_shard_gone(sid.stream, sid.shard, start.shards[sid], self._opts.fail_on_data_loss)
            del positions[sid]
        starts = probe_starts(listing, positions)
        caps: dict[ShardId, str] = {}
        if self.target is not None:
            starts, caps = self.target.bound(starts)
        results = await self._ends(starts, caps, max_records)
        if self.target is not None:
            # Spark ends a Trigger.AvailableNow run at the first batch without new data: while
            # shards have records left within the target, wait for the table to find them.
            deadline = time.monotonic() + SETTLE_TIMEOUT_S
            while starts and not _moved(results) and time.monotonic() < deadline:
                if max_records is not None:
                    await asyncio.sleep(SETTLE_PAUSE_S)
                else:
                    await self._tips.progress(TARGET_WAIT_S)
                results = await self._ends(starts, caps, max_records)
        # A run's first answer holds no shard: it may be its only batch (Trigger.Once, and
        # AvailableNow on pyspark < 4.2, plan one batch and stop), and a held shard's records
        # would wait for a batch that never comes. Its reads wait for the budget in the task.
        holding = self.answers > 0
        self.answers += 1
        lag = {}
        paced = max_records is None and self.target is None
        for sid, result in results.items():
            lag[str(sid)] = lag_entry(result)
            if result.gone:
                positions.pop(sid, None)  # reported by the probe; the listing will drop it
                self._listing.stale()
            elif result.tip is not None and not (paced and holding and self._held(sid, starts[sid])):
                positions[sid] = Position.after(result.tip)
            elif result.ended:
                positions[sid] = Position.shard_end()
                self._listing.stale()  # its children are what comes next
            elif sid not in positions:
                # A newly eligible shard joins the offset at once, even empty, so that its
                # parents can leave it.
                positions[sid] = starts[sid]
        end = Offset(retire_finished(listing, positions, start.shards))
        if paced:
            self.last = LastAnswer.of(start, end, listing, starts, results, lag)
        self.lag = lag
        return end

    def _held(self, sid: ShardId, start: Position) -> bool:
        held = self._handout.held(sid, start)
        if held:
            self._tips.hold_all((sid,))
        return held

    async def _ends(
        self,
        starts: dict[ShardId, Position],
        caps: dict[ShardId, str],
        max_records: int | None,
    ) -> dict[ShardId, ProbeResult]:
        """Each shard's end for the next batch: its tip, or a fair cut under a read limit."""
        tips = self._tips
        if max_records is not None:
            tips.track({}, forget=False)  # a limited batch reads its records itself (with the probe's iterators)
            budget = BudgetPlanner(self._kinesis, self._prober, self._opts.max_records_per_fetch)
            results = await budget.plan(starts, max_records, self._turn, caps)
            if any(r.tip for r in results.values()):
                self._turn += 1  # per batch with data, so every shard in turn is served first
            return results
        fresh = tips.track(starts)
        if fresh:
            await tips.settled(fresh, FIRST_PROBE_TIMEOUT_S)
        return tips.answers(starts, caps)

    def shard_lag(self) -> dict[str, dict]:
        """Each shard's tip and lag as of the last answer (the progress report's ``shards``)."""
        return self.last.lag if self.last is not None else self.lag


def _moved(results: Mapping[ShardId, ProbeResult]) -> bool:
    """True when some shard has a new end (a record, its end, or that it is gone)."""
    return any(r.tip or r.ended or r.gone for r in results.values())
