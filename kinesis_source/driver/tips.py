"""The tip table: each tracked shard's newest known record, kept fresh in the background.

``latestOffset`` answers from the table without AWS calls. A background task on the planner's
event loop (``driver/probe_rounds.py``) probes each shard when it is due:

- a shard that moved, every ``minProbeIntervalMs`` (and no more often than the call budget
  lets the driver, which leaves half of it to executor reads);
- a shard that did not, with exponential backoff up to ``maxIdleProbeIntervalMs`` (jittered
  upwards, so that bound is also the least time between two probes of an idle shard);
- a shard crossing empty pages towards records, every few seconds, going on where it stopped;
- a closed shard, once: at its end nothing more is probed.

Every probe goes on from the iterator the last one left at the tip, so a shard costs one
``GetRecords`` per probe. The ends handed out are records the probe read, so a batch is still
replayable from Spark's offset log alone.

While executors read a shard, the driver does not probe it: their reports of what they saw past
their ranges' ends (``driver/reported.py``, ``kinesis_source/tip_reports.py``) answer as a probe
would, and their iterators become the shard's continuation.

What probes and reports read after a known record is kept as the shard's carried run
(``driver/carried.py``): the next range takes its records from there (:meth:`TipTable.carry`)
instead of reading them again. A shard whose ranges are carried whole needs no executor call,
so its probes may use the shard's whole call budget. With fan-out, a read's subscription
goes on as the shard's tip watch (``executor/watch.py``): while its reports come, the shard is
not probed at all.

Each shard's view (``driver/tip_view.py``) is part of its record in ``driver/shards.py``; this
module says what the views are asked and when they are made.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from kinesis_source.driver.budget import ByteBudget, CallBudget
from kinesis_source.driver.carried import run_cap
from kinesis_source.driver.probe import WARM_READ_BYTES, ProbeResult, TailProber
from kinesis_source.driver.probe_rounds import ProbeRounds
from kinesis_source.driver.reported import Reports
from kinesis_source.driver.tip_view import EXACT_READ_BYTES_PER_S, ShardTip, before
from kinesis_source.positions import Position, ShardId

if TYPE_CHECKING:  # (feeds.py imports the parts this module makes)
    from kinesis_source.driver.feeds import Feeds

__all__ = ["EXACT_READ_BYTES_PER_S", "ShardTip", "TipTable"]

# What a probe reads on from its last tip is carried to the executors: up to CARRY_BYTES a
# shard, and about CARRY_ROUND_BYTES over all the shards a round of probes covers (that bounds
# the driver's share of the reading; below WARM_READ_BYTES a shard's probe is not made smaller).
CARRY_BYTES = 64 * 1024
CARRY_ROUND_BYTES = 4 << 20


def warm_bytes(shards: int) -> int:
    """About what a probe of one of ``shards`` tracked shards reads on from its last tip (or,
    on a first look, at the estimated tip): ``CARRY_ROUND_BYTES`` over them all, within
    ``WARM_READ_BYTES`` and ``CARRY_BYTES`` a shard."""
    return max(WARM_READ_BYTES, min(CARRY_BYTES, CARRY_ROUND_BYTES // max(1, shards)))


class TipTable:
    """The driver's per-shard tips (each shard's view, in its record), the background probes
    that refresh them and the executors' reports that spare those probes."""

    def __init__(
        self,
        prober: TailProber,
        budget: CallBudget,
        active_interval_s: float,
        idle_interval_s: float,
        on_ended: Callable[[], None] = lambda: None,
        carry: bool = True,
        byte_budget: ByteBudget | None = None,
    ) -> None:
        """``carry``: keep what probes and reports read past known records for the ranges that
        start there (not when the ranges are read by fan-out)."""
        self._prober = prober
        self._shards = budget.shards
        # latestOffset's patched answer reads the views from Spark's thread while the loop's
        # probes and reports change them (see driver/planner.py)
        self._lock = self._shards.lock
        self.rounds = ProbeRounds(self._shards, prober, budget, active_interval_s, idle_interval_s,
                                  on_ended, carry)
        self.reported = Reports(self._shards, self.rounds, prober, budget,
                                byte_budget if byte_budget is not None else ByteBudget(None, self._shards))
        # fan-out with the driver's subscriptions: told when views are seeded and dropped
        self.feeds: Feeds | None = None

    @property
    def error(self) -> BaseException | None:
        """What failed the background probing and was not raised yet."""
        return self.rounds.error

    @error.setter
    def error(self, exc: BaseException | None) -> None:
        self.rounds.error = exc

    @property
    def probes(self) -> int:
        """Background probes made."""
        return self.rounds.probes

    @property
    def reports(self) -> int:
        """Executors' reports applied to a tracked shard."""
        return self.reported.applied

    @property
    def entries(self) -> dict[ShardId, ShardTip]:
        """The tracked shards' views (a copy of the index, for tests and tools)."""
        return dict(self._shards.viewed())

    def _view(self, key: ShardId) -> ShardTip | None:
        return self._shards.view(key)

    # -- what latestOffset asks ----------------------------------------------------------

    def track(self, starts: Mapping[ShardId, Position], forget: bool = True) -> list[ShardId]:
        """Track exactly these shards from these starts; the ones (re)seeded now, whose answer
        needs a first probe. Shards no longer asked about (finished, past an AvailableNow
        target) leave the table, and unless not ``forget``, everything known of them."""
        with self._lock:
            return self._track(starts, forget)

    def seed(self, found: Mapping[ShardId, ProbeResult]) -> None:
        """What probes from ``TRIM_HORIZON`` just found (the newest record of each shard, its
        arrival, the lag), to start the shards' views from when the table first tracks them
        from a start before that record: their first answer then costs no probe of its own (an
        AvailableNow run's target probe would otherwise be made twice, 3 calls a shard at one
        a second). Used once per shard."""
        with self._lock:
            for key, result in found.items():
                if result.tip is not None:
                    self._shards.state(key).found = result

    def _track(self, starts: Mapping[ShardId, Position], forget: bool) -> list[ShardId]:
        fresh = []
        for key, _ in list(self._shards.viewed()):
            if key not in starts:
                if self.feeds is not None:
                    self.feeds.dropped(key)
                if forget:
                    self._prober.forget(key)  # (its totals count what the record held)
                    self._shards.forget(key)  # (the prober's registry is this one in a run)
                else:
                    self._shards.state(key).view = None
        for key, start in starts.items():
            state = self._shards.state(key)
            if state.view is None or not state.view.covers(start):
                view = state.view = ShardTip(seed=start, due=time.monotonic())
                state.carried_whole = False
                self.rounds.schedule(key, view)
                if self.feeds is not None:
                    self.feeds.seeded(key, view)
                seeded, state.found = state.found, None
                if seeded is not None and before(start, seeded.tip):
                    # as if its first probe had found it: the next one goes on from that tip
                    self.rounds.probed(key, view, start, ProbeResult(tip=seeded.tip, behind_ms=seeded.behind_ms,
                                                                     tip_at=seeded.tip_at))
                else:
                    fresh.append(key)
        if starts:
            self._prober.warm_bytes = warm_bytes(len(starts))
            self.rounds.run_cap = run_cap(len(starts))
        return fresh

    def answers(self, starts: Mapping[ShardId, Position], caps: Mapping[ShardId, str]) -> dict[ShardId, ProbeResult]:
        """Each tracked shard's end after its start, from the table (no AWS call)."""
        self.raise_error()
        with self._lock:
            self._shards.changed.clear()
            out = {}
            for key, start in starts.items():
                view = self._view(key)
                assert view is not None, f"{key} is not tracked"
                out[key] = view.answer(start, caps.get(key))
            return out

    def raise_error(self) -> None:
        """Raise (once) what failed the background probing since the last answer."""
        with self._lock:
            error, self.rounds.error = self.rounds.error, None
        if error is not None:
            raise error

    def reading(self, keys: list[ShardId], until: float | None) -> None:
        """Executors are about to read ``keys`` and report what they saw past the ends: no
        probe of them until their report, or ``until`` (monotonic; None: no report asked,
        probes go on, and only the batch's end releases the shard) if none comes."""
        with self._lock:
            for key in keys:
                view = self._view(key)
                if view is not None:
                    view.reading_until = view.reading_until if until is None else until
                    self._shards.unreported.add(key)

    def batch_over(self) -> None:
        """The batch whose reads were handed out is over (Spark asks for the next end only
        then): a shard whose report did not come will not get one (the executor could not reach
        the driver, or the read failed), so it is probed now rather than at the deadline."""
        now = time.monotonic()
        with self._lock:
            for key in self._shards.unreported:
                view = self._view(key)
                if view is not None and view.reading_until > now:
                    view.reading_until = 0.0
                    self.rounds.now_due(key, view)
            self._shards.unreported.clear()

    def take_changed(self) -> set[ShardId]:
        """The shards whose answer may have changed since the last call (or since
        :meth:`answers`, which starts the count again), so that a caller can re-answer only
        those."""
        with self._lock:
            changed, self._shards.changed = self._shards.changed, set()
        return changed

    def covered(self, key: ShardId, start: Position) -> ProbeResult | None:
        """``key``'s answer after ``start`` from the table, or None when the table has no view
        that covers ``start`` (then only :meth:`track` and a first probe can answer)."""
        with self._lock:
            view = self._view(key)
            if view is None or not view.covers(start):
                return None
            return view.answer(start, None)

    # -- what a hand-out asks ------------------------------------------------------------

    def carry(self, key: ShardId, start: Position, end_seq: str) -> tuple[tuple[dict, ...], bool, str | None] | None:
        """What the shard's run holds of the range from ``start`` to ``end_seq``, taken out of
        it: the records (all of the range's when the flag is true), and else the iterator that
        reads on after them (None: not known). None when the run does not start there."""
        with self._lock:
            state = self._shards.get(key)
            view = state.view if state is not None else None
            if state is None or view is None:
                return None
            run, view.run = view.run, None
            if run is None or not run.starts(start):
                state.carried_whole = False
                return None  # (a run that this range does not start is dropped)
            records, whole, next_iterator, view.run = run.take(end_seq)
            state.carried_whole = whole
            if not records and next_iterator is None:
                return None
            return records, whole, next_iterator

    def carries(self, key: ShardId, start: Position) -> bool:
        """True when the shard's run holds every record from ``start`` to its tip: the range
        needs no executor call."""
        with self._lock:
            view = self._view(key)
            return view is not None and view.carries(start)

    def hold_all(self, keys: Iterable[ShardId], held: bool = True) -> None:
        """``keys``' known records wait for their shards' read budget (or, with ``held``
        false, were handed to an executor): until then their probes would only spend the
        budget the read waits for, so they pause."""
        with self._lock:
            for key in keys:
                view = self._view(key)
                if view is not None:
                    view.held = held

    def count(self, key: ShardId, start: Position, end_seq: str) -> int | None:
        """:meth:`ShardTip.count` of ``key`` (None when it is not tracked)."""
        with self._lock:
            view = self._view(key)
            return None if view is None else view.count(start, end_seq)

    def read_size(self, key: ShardId, start: Position, end_seq: str) -> int | None:
        """:meth:`ShardTip.read_size` of ``key`` (None when it is not tracked)."""
        with self._lock:
            view = self._view(key)
            return None if view is None else view.read_size(start, end_seq)

    def arrival(self, key: ShardId, seq: str) -> float | None:
        """When record ``seq`` of ``key`` arrived (epoch seconds, the server's clock), if a
        probe or read saw it as a tip."""
        with self._lock:
            view = self._view(key)
            return None if view is None else view.arrivals.get(seq)

    def handed(self, key: ShardId, start: Position, end_seq: str) -> None:
        """A range of ``key`` went to a read (:meth:`ShardTip.hand`)."""
        with self._lock:
            view = self._view(key)
            if view is not None:
                view.hand(start, end_seq)

    def watched_count(self) -> int:
        """How many tracked shards a fan-out subscription watches now."""
        now = time.monotonic()
        with self._lock:
            return sum(1 for _, view in self._shards.viewed() if view.watched_until > now)

    # -- the background work -------------------------------------------------------------

    async def run(self) -> None:
        """Probe due shards until cancelled (``ProbeRounds.run``)."""
        await self.rounds.run()

    async def settled(self, keys: list[ShardId], timeout_s: float) -> None:
        """Wait until each of ``keys`` was probed since it was seeded (or the table failed)."""
        await self.rounds.settled(keys, timeout_s)

    async def progress(self, timeout_s: float) -> None:
        """Wait for the next probe to finish (or ``timeout_s``)."""
        await self.rounds.progress(timeout_s)
