"""Executors' tip reports applied to the shards' records, on the planner's event loop.

A report says what an executor read saw at and past its range's end (``tip_reports.py``). It is
applied as a probe's answer would be: the shard's view learns the tip, the counts and arrivals,
and the records read past the end (carried to the next range); the iterator reads on from
there; the read's actual call times replace what its booking held in the shard's call windows;
the byte model it ended with becomes the shard's. A fan-out read's watch reports hold the
shard's probes off while they come (the watch lease).
"""

from __future__ import annotations

import time

from kinesis_source.driver.budget import ByteBudget, CallBudget
from kinesis_source.driver.probe import TailProber
from kinesis_source.driver.probe_rounds import ProbeRounds
from kinesis_source.driver.shards import ShardState, ShardStates
from kinesis_source.driver.tip_view import ShardTip, after, is_run
from kinesis_source.positions import Position, seq_key
from kinesis_source.tip_reports import WATCH_ENDED, TipReport

# How far an executor's reported call times may lie before its booking (clock skew).
MAX_CLOCK_SKEW_S = 5.0
# An unbooked read's calls (a planned read Spark ran again) count from at most this long ago:
# older ones have left every call window.
UNBOOKED_LOOKBACK_S = 10.0


class Reports:
    """Applies tip reports; counts what they said for the query's progress."""

    def __init__(self, shards: ShardStates, rounds: ProbeRounds, prober: TailProber, budget: CallBudget,
                 byte_budget: ByteBudget) -> None:
        self._shards = shards
        self._rounds = rounds
        self._prober = prober
        self._budget = budget
        self._byte_budget = byte_budget
        self.applied = 0  # reports that taught a tracked shard something
        self.read_bytes = self.extra_bytes = 0  # what executors read, and of it outside their ranges
        self.throttled = 0  # executor reads' calls refused for throughput

    def apply(self, reports: list[TipReport]) -> None:
        """Apply each report to its shard's record (a shard that left the query is skipped)."""
        for tip in reports:
            self.read_bytes += tip.read_bytes
            self.extra_bytes += tip.extra_bytes
            self.throttled += tip.throttled
            with self._shards.lock:
                state = self._shards.get(tip.shard)
                if state is None:
                    continue
                self.view(tip)
                booked = self._settle(state, tip) if tip.watch is None else True
                if tip.rate is not None and booked:
                    self._byte_budget.adopt(tip.shard, tip.rate)
                elif tip.rate is not None:
                    # A read nobody booked: Spark ran a planned read again (a batch's partitions
                    # re-executed by another action, a speculative copy). It started from a
                    # state that missed the first run's bytes, so what it learnt of others may
                    # be that run: only its bytes are kept.
                    self._byte_budget.charge(tip.shard, tip.read_bytes)
                if tip.subscribed_at is not None:
                    at = min(tip.subscribed_at, time.time() + MAX_CLOCK_SKEW_S)
                    if tip.watch is not None:  # (a watch goes on with its read's subscription)
                        at = max(at, state.subscribed_at)
                    state.subscribed_at = at

    def view(self, tip: TipReport) -> bool:
        """Apply a report to its shard's view as a probe's answer (True if the shard is
        tracked and the reported record lies after the view's seed). Its iterator becomes the
        shard's continuation when the record is the newest known."""
        with self._shards.lock:
            key, view = tip.shard, self._shards.view(tip.shard)
            if view is None:
                return False  # a shard that left
            if tip.watch is not None and view.watched(tip, time.monotonic()) and tip.watch == WATCH_ENDED:
                # (also when nothing arrived since the seed) the shard is not watched any more:
                # look at it now rather than at its idle backoff's due time
                self._rounds.now_due(key, view)
            if not after(tip.seq, view.seed):
                return False  # a read of an older range (a replayed batch), or nothing new
            before = view.state()
            now = view.probed_at = time.monotonic()
            made = _iterator_made(tip, now)
            if tip.watch is None:
                self._read(view, tip, now, made)
            newer = view.tip is None or seq_key(tip.seq) > seq_key(view.tip)
            held = self._shards.state(key).feed
            if newer and held is not None and held.view is view:
                # the driver's subscription names the held shard's tips, each with its records
                # in the run: a tip from elsewhere would make the next range wait for them
                newer = False
            if newer:
                view.tip, view.idle = tip.seq, 0
            if view.tip == tip.seq:
                view.behind_ms, view.pending = tip.behind_ms, False
            if tip.iterator is not None:
                # The range that will start after this record reads on with it; and, when the
                # record is the newest known, so does the next probe.
                self._prober.keep_opener(key, Position.after(tip.seq), tip.iterator, made)
                if view.tip == tip.seq:
                    self._prober.keep(key.stream, key.shard, Position.after(tip.seq), tip.iterator, made)
            if tip.behind_ms > 0:
                view.due = now  # more was there than the read took: look from its iterator now
            elif newer:
                view.due = now + self._rounds.active_s
            else:
                self._rounds.idle_again(view, now)
            self._rounds.schedule(key, view)
            if view.state() != before:
                self._shards.changed.add(key)
            self.applied += 1
            return True

    def _read(self, view: ShardTip, tip: TipReport, now: float, made: float) -> None:
        """What a read's report (not a watch's) teaches: the read is over, the range's and what
        followed it counted, the records past its end carried, the shard's byte rate."""
        view.reading_until = 0.0
        self._shards.unreported.discard(tip.shard)
        if tip.seq_at is not None:
            view.arrived(tip.seq, tip.seq_at)
        if tip.end is not None and seq_key(tip.seq) >= seq_key(tip.end):
            before_start = view.handed.pop(tip.end, None)
            if before_start is not None and tip.in_range is not None:
                view.counted(before_start, tip.end, tip.in_range)  # the range itself
            view.counted(tip.end, tip.seq, tip.past)
            if tip.carried is not None and len(tip.carried) == tip.past and is_run(tip.carried, tip.end, tip.seq):
                self._rounds.carry(view, tip.end, list(tip.carried), tip.iterator, made)
        if view.reported_at is not None and now > view.reported_at:
            rate = max(0, tip.read_bytes - tip.extra_bytes) / (now - view.reported_at)
            view.byte_rate = (view.byte_rate + rate) / 2
        view.reported_at = now

    def _settle(self, state: ShardState, tip: TipReport) -> bool:
        """The shard's call windows get the reported read's actual call times in place of its
        booking (times from the executor's clock, kept within what could be true here); a read
        nobody booked (Spark ran a planned read again) adds its calls. Returns whether the read
        was booked."""
        # (a late report of an earlier range does not take the booking of the shard's next one)
        booked = None
        if state.booking is not None and state.booking[0] == tip.end:
            booked, state.booking = state.booking[1], None
        if not tip.calls:
            return booked is not None
        now, wall = time.monotonic(), time.time()
        spent = [t for times in booked.values() for t in times] if booked else []
        earliest = (min(spent) if spent else now - UNBOOKED_LOOKBACK_S) - MAX_CLOCK_SKEW_S
        for op, times in tip.calls.items():
            actual = [min(now, max(earliest, now - (wall - t))) for t in times]
            self._budget.settle(tip.shard, op, booked.get(op, []) if booked else [], actual, tip.made.get(op))
        return booked is not None


def _iterator_made(tip: TipReport, now: float) -> float:
    """When the reported iterator was made (monotonic): at the read's last ``GetRecords``, which
    may be long before the report (a task reports once all its shards are read)."""
    calls = tip.calls.get("GetRecords")
    if not calls:
        return now
    return min(now, now - (time.time() - calls[-1]))
