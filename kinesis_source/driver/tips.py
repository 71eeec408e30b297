"""The tip table: each tracked shard's newest known record, kept fresh in the background.

``latestOffset`` answers from the table without AWS calls. A background task on the planner's
event loop (the :class:`TipTable`'s :meth:`~TipTable.run`) probes each shard when it is due:

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
their ranges' ends (:meth:`TipTable.report`, ``kinesis_source/tip_reports.py``) answer as a probe
would, and their iterators become the shard's continuation.

What probes and reports read after a known record is kept as the shard's carried run
(``driver/carried.py``): the next range takes its records from there (:meth:`TipTable.carry`)
instead of reading them again. A shard whose ranges are carried whole needs no executor call,
so its probes may use the shard's whole call budget. With fan-out, a read's subscription
goes on as the shard's tip watch (``executor/watch.py``): while its reports come, the shard is
not probed at all.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from botocore.exceptions import ClientError

from kinesis_source.aws.clients import error_code
from kinesis_source.aws.kinesis import THROTTLED
from kinesis_source.driver.budget import GET_RECORDS, CallBudget
from kinesis_source.driver.carried import CarriedRun, run_cap
from kinesis_source.driver.probe import SETTLE_PAUSE_S, WARM_READ_BYTES, ProbeResult, TailProber
from kinesis_source.positions import AFTER, AT, TRIM_HORIZON, Position, ShardId, seq_key
from kinesis_source.read_rate import MIN_RATE_SPAN_S, page_bytes, records_between
from kinesis_source.tip_reports import WATCH_ENDED, WATCH_LEASE_S, TipReport

log = logging.getLogger(__name__)

PROBE_CONCURRENCY = 64
THROTTLED_PAUSE_S = 5.0  # after a probe throttled beyond botocore's retries
IDLE_JITTER = 0.2  # an idle shard's interval is stretched by up to this fraction
MAX_ORDINALS = 16  # counted sequence numbers kept per shard (the last few batches' ends)
# A shard whose ranges hold at least this many bytes a second is read with exact sizes: what an
# executor would read past its end costs more of the shard's 2 MiB/s than the probe that then
# finds the tip costs of its calls. Below, the read goes past the end and its report is the tip.
EXACT_READ_BYTES_PER_S = 100_000
# The record rate comes from counted runs of records whose ends' arrivals are known: spans
# shorter than MIN_RATE_SPAN_S are not used, longer ones count in proportion up to this.
RATE_SPAN_S = 5.0
# What a probe reads on from its last tip is carried to the executors: up to CARRY_BYTES a
# shard, and about CARRY_ROUND_BYTES over all the shards a round of probes covers (that bounds
# the driver's share of the reading; below WARM_READ_BYTES a shard's probe is not made smaller).
CARRY_BYTES = 64 * 1024
CARRY_ROUND_BYTES = 4 << 20


@dataclass
class ShardTip:
    """What is known of one shard after the position it was seeded with."""

    seed: Position
    tip: str | None = None  # newest record seen after ``seed``
    ended: bool = False  # closed, and nothing is left after ``tip`` (or ``seed``)
    pending: bool = False  # the last probe crossed only empty pages, still behind the tip
    gone: bool = False  # the stream no longer has the shard
    behind_ms: int = 0
    probed_at: float | None = None  # None: not probed since seeded
    due: float = 0.0  # monotonic time of the next probe
    idle: int = 0  # probes in a row that found nothing new
    probing: bool = False
    held: bool = False  # new records wait for the executors' read budget: probing can wait too
    reading_until: float = 0.0  # monotonic: an executor reads the shard and will report
    # Record counts where reads saw every record: each sequence number's place in one run of
    # records, so that a range between two of them has a known size (see TipTable.count).
    ordinals: dict[str, int] = field(default_factory=dict)
    # Arrival times (epoch seconds, server clock) of the last few tips probes and reads saw: a
    # range between two of them holds about their distance times the shard's record rate.
    arrivals: dict[str, float] = field(default_factory=dict)
    record_rate: float = 0.0  # records a second by arrival, from counts and arrivals (0: not known)
    handed: dict[str, str] = field(default_factory=dict)  # a read range's end -> the record before its start
    reported_at: float | None = None  # monotonic: the last executor report
    byte_rate: float = 0.0  # bytes a second in the ranges executors read (their reports)
    watched_until: float = 0.0  # monotonic: a fan-out subscription reports the shard's tips
    watch_since: float | None = None  # when the watching subscription began (wall clock)
    run: CarriedRun | None = None  # records read after a known record, for the range starting there

    def state(self) -> tuple:
        """What the entry's answers depend on."""
        return (self.tip, self.ended, self.pending, self.gone, self.behind_ms)

    def after(self) -> Position:
        """Where the next probe goes on from."""
        return Position.after(self.tip) if self.tip is not None else self.seed

    def covers(self, start: Position) -> bool:
        """True when what this entry knows applies to a batch starting at ``start``: it was
        seeded there, or it has read past it."""
        if start.to_str() == self.seed.to_str():
            return True
        if start.kind not in (AFTER, AT) or self.tip is None:
            return False
        assert start.seq is not None
        return seq_key(self.tip) >= seq_key(start.seq)

    def answer(self, start: Position, cap: str | None) -> ProbeResult:
        """The end of a batch from ``start``, as a probe would have found it (``covers`` holds)."""
        if self.gone:
            return ProbeResult(gone=True)
        tip = self.tip
        if tip is not None and start.kind in (AFTER, AT) and start.to_str() != self.seed.to_str():
            assert start.seq is not None
            here = start.kind == AT or start.sub_seq is not None  # the start's record still counts
            if seq_key(tip) < seq_key(start.seq) or (seq_key(tip) == seq_key(start.seq) and not here):
                tip = None
        if tip is not None:
            if cap is not None and seq_key(tip) > seq_key(cap):
                tip = cap
            return ProbeResult(tip=tip, behind_ms=self.behind_ms)
        if self.ended:
            return ProbeResult(ended=True)
        return ProbeResult(behind_ms=self.behind_ms, pending=self.pending)


class TipTable:
    """The driver's per-shard tips and the background task that refreshes them."""

    def __init__(
        self,
        prober: TailProber,
        budget: CallBudget,
        active_interval_s: float,
        idle_interval_s: float,
        on_ended: Callable[[], None] = lambda: None,
        carry: bool = True,
    ) -> None:
        """``carry``: keep what probes and reports read past known records for the ranges that
        start there (not when the ranges are read by fan-out)."""
        self._prober = prober
        self._budget = budget
        # Shared with the budget: latestOffset's patched answer reads the table from Spark's
        # thread while the loop's probes and reports change it (see driver/planner.py).
        self._lock = budget.lock
        self._active_s = active_interval_s
        self._idle_s = max(idle_interval_s, active_interval_s)
        self._on_ended = on_ended
        self.entries: dict[ShardId, ShardTip] = {}
        # Shards whose answer may differ from the one last handed out (see take_changed).
        self._dirty: set[ShardId] = set()
        self._unreported: set[ShardId] = set()  # handed out to executors, no report yet
        self.error: BaseException | None = None
        self.probes = 0
        self.reports = 0  # executors' reports applied
        self._wake: asyncio.Event | None = None
        self._changed: asyncio.Condition | None = None
        self._due: list[tuple[float, int, ShardId, ShardTip]] = []
        self._order = itertools.count()
        self._random = random.Random()
        self._carry_runs = carry
        self._run_cap = run_cap(1)
        # What probes of whole shards found before the table tracked them (an AvailableNow
        # target's): a shard's first entry starts from it instead of a probe of its own.
        self._seeds: dict[ShardId, ProbeResult] = {}

    # -- what latestOffset asks ----------------------------------------------------------

    def track(self, starts: Mapping[ShardId, Position], forget: bool = True) -> list[ShardId]:
        """Track exactly these shards from these starts; the ones (re)seeded now, whose answer
        needs a first probe. Shards no longer asked about (finished, past an AvailableNow
        target) leave the table, and unless not ``forget``, what the probe kept for them."""
        with self._lock:
            return self._track(starts, forget)

    def seed(self, found: Mapping[ShardId, ProbeResult]) -> None:
        """What probes from ``TRIM_HORIZON`` just found (the newest record of each shard, its
        arrival, the lag), to start the shards' entries from when the table first tracks them
        from a start before that record: their first answer then costs no probe of its own (an
        AvailableNow run's target probe would otherwise be made twice, 3 calls a shard at one
        a second). Used once per shard."""
        with self._lock:
            self._seeds.update({key: r for key, r in found.items() if r.tip is not None})

    def _track(self, starts: Mapping[ShardId, Position], forget: bool) -> list[ShardId]:
        fresh = []
        for key in list(self.entries):
            if key not in starts:
                del self.entries[key]
                if forget:
                    self._prober.forget(key)
        for key, start in starts.items():
            entry = self.entries.get(key)
            if entry is None or not entry.covers(start):
                entry = self.entries[key] = ShardTip(seed=start, due=time.monotonic())
                self._budget.carrying(key, False)
                self._schedule(key, entry)
                seeded = self._seeds.pop(key, None)
                if seeded is not None and _before(start, seeded.tip):
                    # as if its first probe had found it: the next one goes on from that tip
                    self._probed(key, entry, start, ProbeResult(tip=seeded.tip, behind_ms=seeded.behind_ms,
                                                                tip_at=seeded.tip_at))
                else:
                    fresh.append(key)
        if self.entries:
            share = CARRY_ROUND_BYTES // len(self.entries)
            self._prober.warm_bytes = max(WARM_READ_BYTES, min(CARRY_BYTES, share))
            self._run_cap = run_cap(len(self.entries))
        return fresh

    def answers(self, starts: Mapping[ShardId, Position], caps: Mapping[ShardId, str]) -> dict[ShardId, ProbeResult]:
        """Each tracked shard's end after its start, from the table (no AWS call)."""
        self.raise_error()
        with self._lock:
            self._dirty.clear()
            return {key: self.entries[key].answer(start, caps.get(key)) for key, start in starts.items()}

    def raise_error(self) -> None:
        """Raise (once) what failed the background probing since the last answer."""
        with self._lock:
            error, self.error = self.error, None
        if error is not None:
            raise error

    def reading(self, keys: list[ShardId], until: float) -> None:
        """Executors are about to read ``keys`` and report what they saw past the ends: no
        probe of them until their report, or ``until`` (monotonic) if none comes."""
        with self._lock:
            for key in keys:
                entry = self.entries.get(key)
                if entry is not None:
                    entry.reading_until = until
                    self._unreported.add(key)

    def batch_over(self) -> None:
        """The batch whose reads were handed out is over (Spark asks for the next end only
        then): a shard whose report did not come will not get one (the executor could not reach
        the driver, or the read failed), so it is probed now rather than at the deadline."""
        now = time.monotonic()
        with self._lock:
            for key in self._unreported:
                entry = self.entries.get(key)
                if entry is not None and entry.reading_until > now:
                    entry.reading_until, entry.due = 0.0, now
                    if not entry.probing and not (entry.ended or entry.gone):
                        self._schedule(key, entry)
            self._unreported.clear()

    def report(self, tip: TipReport) -> bool:
        """Apply an executor's report as a probe's answer (True if the shard is tracked and the
        reported record lies after the entry's seed). Its iterator becomes the shard's
        continuation when the record is the newest known."""
        with self._lock:
            return self._report(tip)

    def _report(self, tip: TipReport) -> bool:
        key, entry = tip.shard, self.entries.get(tip.shard)
        if entry is None:
            return False  # a shard that left
        if tip.watch is not None and self._watched(entry, tip, time.monotonic()) and tip.watch == WATCH_ENDED:
            # (also when nothing arrived since the seed) the shard is not watched any more:
            # look at it now rather than at its idle backoff's due time
            entry.due = time.monotonic()
            if not entry.probing and not (entry.ended or entry.gone):
                self._schedule(key, entry)
        if not _after(tip.seq, entry.seed):
            return False  # a read of an older range (a replayed batch), or nothing new
        before = entry.state()
        now = entry.probed_at = time.monotonic()
        made = _iterator_made(tip, now)
        if tip.watch is None:
            entry.reading_until = 0.0
            self._unreported.discard(key)
            if tip.seq_at is not None:
                entry.arrivals[tip.seq] = tip.seq_at
                _trim(entry.arrivals)
            if tip.end is not None and seq_key(tip.seq) >= seq_key(tip.end):
                before_start = entry.handed.pop(tip.end, None)
                if before_start is not None and tip.in_range is not None:
                    self._counted(entry, before_start, tip.end, tip.in_range)  # the range itself
                self._counted(entry, tip.end, tip.seq, tip.past)
                if tip.carried is not None and len(tip.carried) == tip.past and _is_run(tip.carried, tip.end, tip.seq):
                    self._carry(entry, tip.end, list(tip.carried), tip.iterator, made)
            if entry.reported_at is not None and now > entry.reported_at:
                rate = max(0, tip.read_bytes - tip.extra_bytes) / (now - entry.reported_at)
                entry.byte_rate = (entry.byte_rate + rate) / 2
            entry.reported_at = now
        newer = entry.tip is None or seq_key(tip.seq) > seq_key(entry.tip)
        if newer:
            entry.tip, entry.idle = tip.seq, 0
        if entry.tip == tip.seq:
            entry.behind_ms, entry.pending = tip.behind_ms, False
        if tip.iterator is not None:
            # The range that will start after this record reads on with it; and, when the record
            # is the newest known, so does the next probe.
            self._prober.keep_opener(key, Position.after(tip.seq), tip.iterator, made)
            if entry.tip == tip.seq:
                self._prober.keep(key.stream, key.shard, Position.after(tip.seq), tip.iterator, made)
        if tip.behind_ms > 0:
            entry.due = now  # more was there than the read took: look from its iterator now
        elif newer:
            entry.due = now + self._active_s
        else:
            self._idle_again(entry, now)
        if not entry.probing and not (entry.ended or entry.gone):
            self._schedule(key, entry)
        if entry.state() != before:
            self._dirty.add(key)
        self.reports += 1
        return True

    @staticmethod
    def _watched(entry: ShardTip, tip: TipReport, now: float) -> bool:
        """Apply a tip watch's report to the lease (True if it did): a live watch keeps the
        probes away for ``WATCH_LEASE_S``; the end of the watch that holds the lease gives the
        shard back to them (an older watch's end, taken over by the read whose watch now
        reports, does not)."""
        since = tip.subscribed_at if tip.subscribed_at is not None else 0.0
        if entry.watch_since is not None and since < entry.watch_since:
            return False
        if tip.watch == WATCH_ENDED:
            entry.watched_until, entry.watch_since = 0.0, None
        else:
            entry.watched_until, entry.watch_since = now + WATCH_LEASE_S, since
        return True

    def watched_count(self) -> int:
        """How many tracked shards a fan-out subscription watches now."""
        now = time.monotonic()
        with self._lock:
            return sum(1 for entry in self.entries.values() if entry.watched_until > now)

    def count(self, key: ShardId, start: Position, end_seq: str) -> int | None:
        """How many records a range from ``start`` to ``end_seq`` holds, when reads (probes or
        executors' reports) saw every record between them; else None. Only a read's ``Limit``
        depends on it: a wrong count costs a call or some bytes, never a record."""
        entry = self.entries.get(key)
        if entry is None or start.kind != AFTER or start.sub_seq is not None or start.seq is None:
            return None
        with self._lock:
            first, last = entry.ordinals.get(start.seq), entry.ordinals.get(end_seq)
        if first is None or last is None or last < first:
            return None
        return last - first

    def read_size(self, key: ShardId, start: Position, end_seq: str) -> int | None:
        """The size an executor reads a range with, where the shard's ranges hold
        ``EXACT_READ_BYTES_PER_S`` or more (else None: reading past the end costs little, and
        the read's report then is the shard's next tip, with no probe): its :meth:`count`, or
        else, when probes or reads saw both its ends arrive, their distance at the shard's
        record rate, ``ESTIMATE_MARGIN`` more."""
        entry = self.entries.get(key)
        if entry is None or entry.byte_rate < EXACT_READ_BYTES_PER_S:
            return None
        counted = self.count(key, start, end_seq)
        if counted is not None or start.kind != AFTER or start.seq is None:
            return counted
        with self._lock:
            first, last = entry.arrivals.get(start.seq), entry.arrivals.get(end_seq)
            rate = entry.record_rate
        if first is None or last is None or last < first or not rate:
            return None
        return records_between(first, last, rate)

    def arrival(self, key: ShardId, seq: str) -> float | None:
        """When record ``seq`` of ``key`` arrived (epoch seconds, the server's clock), if a
        probe or read saw it as a tip."""
        with self._lock:
            entry = self.entries.get(key)
            return None if entry is None else entry.arrivals.get(seq)

    def handed(self, key: ShardId, start: Position, end_seq: str) -> None:
        """A range of ``key`` went to a read: its report, which says how many records it held,
        counts them (and their arrivals teach the shard's record rate)."""
        with self._lock:
            entry = self.entries.get(key)
            if entry is None or start.kind != AFTER or start.sub_seq is not None or start.seq is None:
                return
            entry.handed[end_seq] = start.seq
            _trim(entry.handed)

    def _counted(self, entry: ShardTip, after: str, to: str, records: int) -> None:
        """A read saw all ``records`` records after ``after`` up to ``to``."""
        base = entry.ordinals.get(after)
        if base is None:  # not in the run counted so far: a new run starts here
            entry.ordinals = {after: 0}
            base = 0
        entry.ordinals[to] = base + records
        begun, ended = entry.arrivals.get(after), entry.arrivals.get(to)
        if begun is not None and ended is not None and ended - begun >= MIN_RATE_SPAN_S:
            # records a second by arrival; a longer span weighs more (a producer's batches make
            # short ones coarse)
            sample = records / (ended - begun)
            weight = min(1.0, (ended - begun) / RATE_SPAN_S)
            entry.record_rate = sample if not entry.record_rate else entry.record_rate + weight * (
                sample - entry.record_rate)
        _trim(entry.ordinals)

    def _carry(self, entry: ShardTip, after: str, records: list[dict], next_iterator: str | None,
               made: float | None = None) -> None:
        """Records read right after record ``after``: they extend the shard's run when it ends
        there, else start a new one (within the run's byte cap); ``next_iterator`` was made at
        ``made`` (monotonic; None: now)."""
        if not self._carry_runs:
            return
        if entry.run is not None:
            extended = entry.run.extended(after, records, next_iterator, self._run_cap, made)
            if extended is not None:
                entry.run = extended
                return
        entry.run = None
        if records and page_bytes(records) <= self._run_cap:
            entry.run = CarriedRun(after, records, next_iterator,
                                   iterator_at=time.monotonic() if made is None else made)

    def carry(self, key: ShardId, start: Position, end_seq: str) -> tuple[tuple[dict, ...], bool, str | None] | None:
        """What the shard's run holds of the range from ``start`` to ``end_seq``, taken out of
        it: the records (all of the range's when the flag is true), and else the iterator that
        reads on after them (None: not known). None when the run does not start there."""
        with self._lock:
            entry = self.entries.get(key)
            if entry is None:
                return None
            run, entry.run = entry.run, None
            if run is None or start.kind != AFTER or start.sub_seq is not None or start.seq != run.after:
                self._budget.carrying(key, False)
                return None  # (a run that this range does not start is dropped)
            records, whole, next_iterator, entry.run = run.take(end_seq)
            self._budget.carrying(key, whole)
            if not records and next_iterator is None:
                return None
            return records, whole, next_iterator

    def carries(self, key: ShardId, start: Position) -> bool:
        """True when the shard's run holds every record from ``start`` to its tip: the range
        needs no executor call."""
        with self._lock:
            entry = self.entries.get(key)
            if entry is None or entry.run is None or entry.tip is None or start.kind != AFTER:
                return False
            run = entry.run
            return start.sub_seq is None and start.seq == run.after and seq_key(run.last) >= seq_key(entry.tip)

    def hold(self, key: ShardId, held: bool = True) -> None:
        """``key``'s known records wait for the shard's read budget (or, with ``held`` false,
        were handed to an executor): until then its probes would only spend the budget the
        read waits for, so they pause."""
        with self._lock:
            entry = self.entries.get(key)
            if entry is not None:
                entry.held = held

    def take_changed(self) -> set[ShardId]:
        """The shards whose answer may have changed since the last call (or since
        :meth:`answers`, which starts the count again), so that a caller can re-answer only
        those."""
        with self._lock:
            changed, self._dirty = self._dirty, set()
        return changed

    def covered(self, key: ShardId, start: Position) -> ProbeResult | None:
        """``key``'s answer after ``start`` from the table, or None when the table has no entry
        that covers ``start`` (then only :meth:`track` and a first probe can answer)."""
        with self._lock:
            entry = self.entries.get(key)
            if entry is None or not entry.covers(start):
                return None
            return entry.answer(start, None)

    async def settled(self, keys: list[ShardId], timeout_s: float) -> None:
        """Wait until each of ``keys`` was probed since it was seeded (or the table failed)."""
        changed = self._condition()
        deadline = time.monotonic() + timeout_s

        def ready() -> bool:
            return self.error is not None or all(
                (e := self.entries.get(k)) is None or e.probed_at is not None for k in keys
            )

        async with changed:
            while not ready():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                try:
                    await asyncio.wait_for(changed.wait(), left)
                except asyncio.TimeoutError:
                    return

    async def progress(self, timeout_s: float) -> None:
        """Wait for the next probe round to finish (or ``timeout_s``)."""
        changed = self._condition()
        async with changed:
            try:
                await asyncio.wait_for(changed.wait(), timeout_s)
            except asyncio.TimeoutError:
                pass

    # -- the background task -------------------------------------------------------------

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _schedule(self, key: ShardId, entry: ShardTip) -> None:
        heapq.heappush(self._due, (entry.due, next(self._order), key, entry))
        self._poke()

    async def run(self) -> None:
        """Probe due shards until cancelled; a probe's error is kept for ``answers`` to raise.
        Due times sit in a heap (stale rows are skipped), so a round costs O(log shards) per
        shard probed, not a scan of the table."""
        self._wake = asyncio.Event()
        gate = asyncio.Semaphore(PROBE_CONCURRENCY)
        tasks: set[asyncio.Task] = set()
        try:
            await self._rounds(gate, tasks)
        finally:
            # The probes in flight stop with the table (the client they use is closed next).
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _rounds(self, gate: asyncio.Semaphore, tasks: set[asyncio.Task]) -> None:
        assert self._wake is not None
        while True:
            self._wake.clear()
            now = time.monotonic()
            while self._due and self._due[0][0] <= now and self.error is None:
                due, _, key, entry = heapq.heappop(self._due)
                if self.entries.get(key) is not entry or entry.due != due or entry.probing:
                    continue  # replaced, rescheduled or being probed: a stale row
                if entry.ended or entry.gone:
                    continue
                # Records waiting for the read budget, or an executor's report due first.
                wait = now + self._active_s if entry.held else max(entry.reading_until, entry.watched_until)
                if wait > now:
                    entry.due = wait
                    heapq.heappush(self._due, (wait, next(self._order), key, entry))
                    continue
                free = self._budget.free_at(key, GET_RECORDS, self._budget.reserve(GET_RECORDS, key), now)
                if free > now:
                    entry.due = free
                    heapq.heappush(self._due, (free, next(self._order), key, entry))
                    continue
                entry.probing = True
                task = asyncio.ensure_future(self._probe(gate, key, entry))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            # A timer sets the event instead of asyncio.wait_for, which on Python 3.11 can
            # swallow a cancellation arriving as the event is set, so stopping hung.
            timer = None
            if self._due:
                wait = max(0.0, self._due[0][0] - time.monotonic())
                timer = asyncio.get_running_loop().call_later(wait, self._wake.set)
            try:
                await self._wake.wait()
            finally:
                if timer is not None:
                    timer.cancel()

    async def _probe(self, gate: asyncio.Semaphore, key: ShardId, entry: ShardTip) -> None:
        start = entry.after()
        try:
            async with gate:
                start = entry.after()  # (a report may have moved the entry on meanwhile)
                result = await self._prober.probe(key.stream, key.shard, start)
        except asyncio.CancelledError:
            raise
        except ClientError as exc:
            result = None
            if error_code(exc) != THROTTLED:
                self._failed(exc)
            else:
                # Other applications took the shard's quota even after botocore's retries: the
                # table keeps its last answer and tries again later; the query only slows.
                log.warning("probe of %s throttled after retries; trying again in %.0f s", key, THROTTLED_PAUSE_S)
                entry.due = time.monotonic() + THROTTLED_PAUSE_S
        except BaseException as exc:
            self._failed(exc)
            result = None
        finally:
            entry.probing = False
        self.probes += 1
        with self._lock:
            self._probed(key, entry, start, result)
        changed = self._condition()
        async with changed:
            changed.notify_all()

    def _failed(self, exc: BaseException) -> None:
        with self._lock:
            self.error = exc  # surfaced by the next latestOffset

    def _probed(self, key: ShardId, entry: ShardTip, start: Position, result: ProbeResult | None) -> None:
        if result is not None:
            before = entry.state()
            if result.tip is not None and result.tip_at is not None:
                entry.arrivals[result.tip] = result.tip_at
                _trim(entry.arrivals)
            if result.counted is not None and result.tip is not None and start.kind == AFTER \
                    and start.sub_seq is None and start.seq is not None:
                self._counted(entry, start.seq, result.tip, result.counted)
            if result.run and start.kind == AFTER and start.sub_seq is None and start.seq is not None:
                self._carry(entry, start.seq, list(result.run), result.run_next)
            self._update(entry, result)
            if entry.state() != before:
                self._dirty.add(key)
        elif entry.probed_at is None and self.error is None:
            entry.probed_at = time.monotonic()  # a first answer is due: "nothing known yet"
        if not (entry.ended or entry.gone) and self.entries.get(key) is entry:
            self._schedule(key, entry)

    def _update(self, entry: ShardTip, result: ProbeResult) -> None:
        now = time.monotonic()
        entry.probed_at = now
        entry.behind_ms = result.behind_ms
        entry.pending = result.pending
        if result.gone:
            entry.gone = True
            self._on_ended()
        elif result.tip is not None:
            if entry.tip is None or seq_key(result.tip) > seq_key(entry.tip):
                entry.tip = result.tip  # (an executor's report may have gone further meanwhile)
            entry.idle = 0
            entry.due = now + self._active_s
        elif result.ended:
            entry.ended = True
            self._on_ended()
        elif result.pending:
            entry.due = now + SETTLE_PAUSE_S
        else:
            self._idle_again(entry, now)

    def _idle_again(self, entry: ShardTip, now: float) -> None:
        """Nothing new on the shard: its next look backs off."""
        entry.idle += 1
        interval = min(self._idle_s, self._active_s * 2 ** min(entry.idle, 30))
        entry.due = now + interval * (1 + IDLE_JITTER * self._random.random())


def _before(start: Position, seq: str | None) -> bool:
    """True when the record ``seq`` lies after ``start`` (so it is the newest record after it
    too, if it was the shard's newest); False where that is not known (timestamps, LATEST)."""
    if seq is None:
        return False
    if start.kind == TRIM_HORIZON:
        return True
    if start.kind == AFTER and start.seq is not None:
        return seq_key(start.seq) < seq_key(seq)
    if start.kind == AT and start.seq is not None:
        return seq_key(start.seq) <= seq_key(seq)
    return False


def _trim(kept: dict) -> None:
    """Drop the oldest entries past ``MAX_ORDINALS``: a shard's per-record facts (places in a
    counted run, arrivals, handed ranges) are only needed for the last few batches' ends."""
    while len(kept) > MAX_ORDINALS:
        del kept[next(iter(kept))]


def _is_run(records: tuple[dict, ...], after: str, last: str) -> bool:
    """True when ``records`` are in order after record ``after`` and end with ``last``."""
    if not records or records[-1]["SequenceNumber"] != last:
        return False
    keys = [seq_key(after)] + [seq_key(r["SequenceNumber"]) for r in records]
    return all(a < b for a, b in itertools.pairwise(keys))


def _after(seq: str, seed: Position) -> bool:
    """True when record ``seq`` lies after ``seed`` (positions without a record: any)."""
    if seed.kind not in (AFTER, AT) or seed.seq is None:
        return True
    return seq_key(seq) > seq_key(seed.seq) or (seed.kind == AT and seq == seed.seq)


def _iterator_made(tip: TipReport, now: float) -> float:
    """When the reported iterator was made (monotonic): at the read's last ``GetRecords``, which
    may be long before the report (a task reports once all its shards are read)."""
    calls = tip.calls.get("GetRecords")
    if not calls:
        return now
    return min(now, now - (time.time() - calls[-1]))
