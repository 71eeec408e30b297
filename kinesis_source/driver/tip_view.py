"""One shard's view in the tip table: what is known of it after the position it was seeded with.

The view is part of the shard's record (``driver/shards.py``) and is replaced when the shard is
seeded again (a batch starts somewhere the view does not cover). Its rules are here: how it
answers for a batch's start, how reads that saw every record count ranges, how a shard's record
rate is learnt, what it carries to the next range, and the fan-out watch lease.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from kinesis_source.driver.carried import CarriedRun
from kinesis_source.driver.probe import ProbeResult
from kinesis_source.positions import AFTER, AT, TRIM_HORIZON, Position, seq_key
from kinesis_source.read_rate import MIN_RATE_SPAN_S, page_bytes, records_between
from kinesis_source.tip_reports import WATCH_ENDED, WATCH_LEASE_S, TipReport

MAX_ORDINALS = 16  # counted sequence numbers kept per shard (the last few batches' ends)
# A shard whose ranges hold at least this many bytes a second is read with exact sizes: what an
# executor would read past its end costs more of the shard's 2 MiB/s than the probe that then
# finds the tip costs of its calls. Below, the read goes past the end and its report is the tip.
EXACT_READ_BYTES_PER_S = 100_000
# The record rate comes from counted runs of records whose ends' arrivals are known: spans
# shorter than MIN_RATE_SPAN_S are not used, longer ones count in proportion up to this.
RATE_SPAN_S = 5.0


@dataclass(eq=False)
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
    # records, so that a range between two of them has a known size (see count).
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
        """What the view's answers depend on."""
        return (self.tip, self.ended, self.pending, self.gone, self.behind_ms)

    def after(self) -> Position:
        """Where the next probe goes on from."""
        return Position.after(self.tip) if self.tip is not None else self.seed

    def live(self) -> bool:
        """True while the shard may still be probed (not at its end, not gone)."""
        return not (self.ended or self.gone)

    def covers(self, start: Position) -> bool:
        """True when what this view knows applies to a batch starting at ``start``: it was
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

    # -- sizes and rates -----------------------------------------------------------------

    def counted(self, after: str, to: str, records: int) -> None:
        """A read saw all ``records`` records after ``after`` up to ``to``."""
        base = self.ordinals.get(after)
        if base is None:  # not in the run counted so far: a new run starts here
            self.ordinals = {after: 0}
            base = 0
        self.ordinals[to] = base + records
        begun, ended = self.arrivals.get(after), self.arrivals.get(to)
        if begun is not None and ended is not None and ended - begun >= MIN_RATE_SPAN_S:
            # records a second by arrival; a longer span weighs more (a producer's batches make
            # short ones coarse)
            sample = records / (ended - begun)
            weight = min(1.0, (ended - begun) / RATE_SPAN_S)
            self.record_rate = sample if not self.record_rate else self.record_rate + weight * (
                sample - self.record_rate)
        trim(self.ordinals)

    def arrived(self, seq: str, at: float) -> None:
        """Record ``seq`` arrived at ``at`` (epoch seconds, the server's clock)."""
        self.arrivals[seq] = at
        trim(self.arrivals)

    def count(self, start: Position, end_seq: str) -> int | None:
        """How many records a range from ``start`` to ``end_seq`` holds, when reads (probes or
        executors' reports) saw every record between them; else None. Only a read's ``Limit``
        depends on it: a wrong count costs a call or some bytes, never a record."""
        if start.kind != AFTER or start.sub_seq is not None or start.seq is None:
            return None
        first, last = self.ordinals.get(start.seq), self.ordinals.get(end_seq)
        if first is None or last is None or last < first:
            return None
        return last - first

    def read_size(self, start: Position, end_seq: str) -> int | None:
        """The size an executor reads a range with, where the shard's ranges hold
        ``EXACT_READ_BYTES_PER_S`` or more (else None: reading past the end costs little, and
        the read's report then is the shard's next tip, with no probe): its :meth:`count`, or
        else, when probes or reads saw both its ends arrive, their distance at the shard's
        record rate, a margin more."""
        if self.byte_rate < EXACT_READ_BYTES_PER_S:
            return None
        counted = self.count(start, end_seq)
        if counted is not None or start.kind != AFTER or start.seq is None:
            return counted
        first, last = self.arrivals.get(start.seq), self.arrivals.get(end_seq)
        if first is None or last is None or last < first or not self.record_rate:
            return None
        return records_between(first, last, self.record_rate)

    def hand(self, start: Position, end_seq: str) -> None:
        """A range went to a read: its report, which says how many records it held, counts
        them (and their arrivals teach the shard's record rate)."""
        if start.kind != AFTER or start.sub_seq is not None or start.seq is None:
            return
        self.handed[end_seq] = start.seq
        trim(self.handed)

    # -- the carried run -------------------------------------------------------------------

    def carry(self, after: str, records: list[dict], next_iterator: str | None, cap: int,
              made: float | None = None) -> None:
        """Records read right after record ``after``: they extend the shard's run when it ends
        there, else start a new one (within ``cap`` bytes); ``next_iterator`` was made at
        ``made`` (monotonic; None: now)."""
        if self.run is not None:
            extended = self.run.extended(after, records, next_iterator, cap, made)
            if extended is not None:
                self.run = extended
                return
        self.run = None
        if records and page_bytes(records) <= cap:
            self.run = CarriedRun(after, records, next_iterator,
                                  iterator_at=time.monotonic() if made is None else made)

    def carries(self, start: Position) -> bool:
        """True when the run holds every record from ``start`` to the tip."""
        run = self.run
        if run is None or self.tip is None or not run.starts(start) or not run.last:
            return False
        return seq_key(run.last) >= seq_key(self.tip)

    # -- fan-out watches -------------------------------------------------------------------

    def watched(self, tip: TipReport, now: float) -> bool:
        """Apply a tip watch's report to the lease (True if it did): a live watch keeps the
        probes away for ``WATCH_LEASE_S``; the end of the watch that holds the lease gives the
        shard back to them (an older watch's end, taken over by the read whose watch now
        reports, does not)."""
        since = tip.subscribed_at if tip.subscribed_at is not None else 0.0
        if self.watch_since is not None and since < self.watch_since:
            return False
        if tip.watch == WATCH_ENDED:
            self.watched_until, self.watch_since = 0.0, None
        else:
            self.watched_until, self.watch_since = now + WATCH_LEASE_S, since
        return True


def before(start: Position, seq: str | None) -> bool:
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


def after(seq: str, seed: Position) -> bool:
    """True when record ``seq`` lies after ``seed`` (positions without a record: any)."""
    if seed.kind not in (AFTER, AT) or seed.seq is None:
        return True
    return seq_key(seq) > seq_key(seed.seq) or (seed.kind == AT and seq == seed.seq)


def trim(kept: dict) -> None:
    """Drop the oldest entries past ``MAX_ORDINALS``: a shard's per-record facts (places in a
    counted run, arrivals, handed ranges) are only needed for the last few batches' ends."""
    while len(kept) > MAX_ORDINALS:
        del kept[next(iter(kept))]


def is_run(records: tuple[dict, ...], after: str, last: str) -> bool:
    """True when ``records`` are in order after record ``after`` and end with ``last``."""
    if not records or records[-1]["SequenceNumber"] != last:
        return False
    keys = [seq_key(after)] + [seq_key(r["SequenceNumber"]) for r in records]
    return all(a < b for a, b in itertools.pairwise(keys))
