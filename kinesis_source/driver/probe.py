"""The tail probe: where a shard's next batch ends, found with a few small reads near its tip.

Kinesis has no "latest offset" call. For each shard the probe

1. goes on from the iterator the previous probe left at its tip when there is one, reading what
   arrived since in one call (an idle shard, or a shard that gets less than
   ``WARM_READ_LIMIT`` records between probes, costs one call); from anywhere else it reads one
   record after the start, checking that the start's own record is still there;
2. if records remain, estimates the arrival time of the newest record from the last record's arrival time plus
   ``MillisBehindLatest`` (both server clocks, so driver clock skew does not matter), opens an
   ``AT_TIMESTAMP`` iterator a small window before it and reads to the tip, widening the window
   x8 while it comes back empty, never reaching back before the start (a backlog is not read
   on the driver). The iterator and its page first wait for the shard's call and byte budgets
   (``PacedKinesis.ready``); a wait moves the estimate on by its length, so the page does not
   read what arrived while it waited; but the first look at a shard (a cold start, nothing
   says it is written to) first reads a warm page where the estimate put the tip, which finds
   a backlog's tip in that call or the next.

A probe that went on from its iterator returns the records it read there (``run``): they are
exactly the shard's records after the start, and the tip table carries them to the executor
that reads the batch from that start (``driver/carried.py``), which then reads none of them
again. It also remembers the iterator with the first record it found (as does a cold start's
probe whose iterator opened at the start itself): an executor whose range starts there and is
not carried reads on with it (``opener``) instead of asking for a new one.

The last record read at the tip is the batch's exact, inclusive end. Any record after the start
is a valid end: a tip that is a little stale only moves data to the next batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from botocore.exceptions import ClientError

from kinesis_source.aws.clients import error_code
from kinesis_source.aws.kinesis import HANDED_ITERATOR_TTL_S, INVALID_ARGUMENT, AsyncKinesis, Page, arrival_seconds
from kinesis_source.driver.budget import GET_RECORDS, GET_SHARD_ITERATOR
from kinesis_source.driver.shards import ShardStates
from kinesis_source.errors import (
    ShardNotFoundError,
    report_data_loss,
    report_shard_gone,
)
from kinesis_source.executor.cursor import check_opening, opening_position
from kinesis_source.positions import AFTER, Position, ShardId, seq_key

log = logging.getLogger(__name__)

# First probe window before the estimated tip: the estimate is precise to ~1 ms, so a few ms
# hold the newest records (one producer burst) and little else.
INITIAL_WINDOW_S = 0.005
WINDOW_GROWTH = 8
# Once a probe waited for its budget after finding where the tip was, the tip is estimated to
# have moved on by the wait; how records arrived meanwhile is not known, so the window is at
# least the wait, up to this (a producer putting a batch of records every 100 ms leaves gaps
# that long).
MOVED_WINDOW_S = 0.2
MOVED_MIN_S = 0.05  # a shorter wait moves nothing: the window is placed as the first page says
# A cold look that stopped this close behind the tip (MillisBehindLatest) reads one more warm page: nothing
# to speak of arrived while it waited, it only stopped inside the last burst of records.
LOOK_READ_ON_MS = 200
# Empty pages followed (while behind) before the check gives up until the next probe: real
# Kinesis can serve empty pages over gaps in a shard.
MAX_EMPTY_HOPS = 4
# Pages read from the window to the tip; past this the last record read is the end (still exact).
MAX_TIP_PAGES = 10
# Iterators live 5 minutes; a cached one older than this is not reused.
ITERATOR_TTL_S = 240.0
_OPENERS_PER_SHARD = 4  # a batch starts at one of the last few probes' starts
# Records a probe reads on from its last tip in one call: about ``TailProber.warm_bytes`` by the
# shard's records seen so far (WARM_READ_LIMIT records while their size is not known). What it
# reads is carried to the executors, not read again; the bytes bound the driver's share of the
# reading (the tip table sets it from how many shards it tracks), and a busy shard's probe then
# jumps near the tip.
WARM_READ_LIMIT = 10
WARM_READ_BYTES = 10_000
# At most this many records, whatever their size as last seen (a shard whose records grow does
# not get a page of the old size's count at the new size).
WARM_READ_RECORDS = 1000
# Where a probe must find an answer (LATEST, a Trigger.AvailableNow target), probes of shards
# that crossed only empty pages are repeated, this far apart: each makes at most
# MAX_EMPTY_HOPS + 1 calls, so a settling shard costs at most 2 GetRecords/s of the 5 per shard
# that every application reading it shares. Up to SETTLE_TIMEOUT_S.
SETTLE_PAUSE_S = (MAX_EMPTY_HOPS + 1) / 2
SETTLE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ProbeResult:
    """What a probe found after a start position."""

    tip: str | None = None  # newest record seen after the start, None if there is none
    ended: bool = False  # the shard is closed and the start is at its end
    behind_ms: int = 0  # MillisBehindLatest of the first record after the start: the lag
    # Only empty pages were read, still behind the tip: records may lie further on. The
    # iterator after those pages is kept, so the next probe goes on from there.
    pending: bool = False
    gone: bool = False  # the stream no longer has the shard (reported as failOnDataLoss says)
    counted: int | None = None  # records after the start up to ``tip``, when the probe read them all
    tip_at: float | None = None  # the tip record's arrival (epoch seconds, the server's clock)
    # The records read on from the start's continuation (an ``AFTER`` start): exactly the
    # shard's first records after it, in order, and the iterator reading on after the last.
    run: tuple[dict, ...] = ()
    run_next: str | None = None


class TailProber:
    """Finds the tip of shards with O(1) small reads each; keeps continuation iterators."""

    def __init__(
        self, kinesis: AsyncKinesis, page_limit: int, fail_on_data_loss: bool = True,
        shards: ShardStates | None = None,
    ) -> None:
        """``shards``: the query run's shard records, which keep each shard's continuation,
        openers and record size (a registry of its own if None)."""
        self._kinesis = kinesis
        self._page_limit = page_limit
        self.fail_on_data_loss = fail_on_data_loss
        self._shards = shards if shards is not None else ShardStates()
        self.warm_bytes = WARM_READ_BYTES  # about what a probe reads on from its last tip

    def _take(self, stream: str, shard: str, start: Position) -> tuple[str, float] | None:
        """The iterator kept at ``start`` and when it was made (monotonic), if still usable."""
        state = self._shards.state(ShardId(stream, shard))
        cached, state.continuation = state.continuation, None
        if cached is None:
            return None
        pos, iterator, made = cached
        if pos != start.to_str() or time.monotonic() - made > ITERATOR_TTL_S:
            return None
        return iterator, made

    def keep(self, stream: str, shard: str, pos: Position, iterator: str | None, made: float | None = None) -> None:
        """Remember an iterator at ``pos``, made at ``made`` (monotonic; None: now): the next
        probe from there costs one call."""
        if iterator is not None:
            at = time.monotonic() if made is None else made
            self._shards.state(ShardId(stream, shard)).continuation = (pos.to_str(), iterator, at)

    async def first_page(self, stream: str, shard: str, start: Position, limit: int) -> Page:
        """The first page after ``start``: from the iterator a previous probe left there, else
        from a new iterator, checking that ``start``'s record is still there."""
        cached = self._take(stream, shard, start)
        if cached is not None:
            return await self._kinesis.page_at(stream, shard, start, limit, cached[0])
        return await self._open(stream, shard, start, limit)

    async def probe(
        self, stream: str, shard: str, start: Position, cap: str | None = None
    ) -> ProbeResult:
        """The newest record after ``start`` in one shard (or that there is none); with
        ``cap``, the newest record not after the sequence number ``cap``. A shard the stream no
        longer has fails the probe, or with ``failOnDataLoss=false`` is reported ``gone``."""
        try:
            return await self._probe(stream, shard, start, cap)
        except ShardNotFoundError:
            pass  # reported outside the handler, so the user's error carries no chained one
        report_shard_gone(stream, shard, start, self.fail_on_data_loss)
        return ProbeResult(gone=True)

    async def _probe(
        self, stream: str, shard: str, start: Position, cap: str | None
    ) -> ProbeResult:
        k = self._kinesis
        cached = self._take(stream, shard, start)
        # From the iterator the last probe left at the tip, what follows is what arrived since:
        # read it (one call in steady state). From anywhere else, one record, then look near the
        # tip, so that a backlog is not read on the driver.
        key = ShardId(stream, shard)
        limit = self._warm_limit(key) if cached is not None else 1
        if cached is not None:
            page = await k.page_at(stream, shard, start, limit, cached[0])
            if page.records:  # (handed on as old as it is: an executor must not get it expired)
                self._hand_over(key, start, cached[0], page.records[0]["SequenceNumber"], cached[1])
        else:
            page = await self._open(stream, shard, start, limit)
        hops = 0
        while not page.records and not page.at_tip and hops < MAX_EMPTY_HOPS:
            page = await k.page(stream, shard, page.next_iterator, limit)  # type: ignore[arg-type]
            hops += 1
        if not page.records:
            if page.next_iterator is None:
                return ProbeResult(ended=True)
            # No record lies between the start and this iterator: it continues the start.
            self.keep(stream, shard, start, page.next_iterator)
            if page.at_tip:
                return ProbeResult()
            return ProbeResult(behind_ms=page.behind_ms, pending=True)
        self._shards.state(key).record_bytes = sum(len(r["Data"]) for r in page.records) / len(page.records)
        run: tuple[dict, ...] = ()
        if cached is not None and start.kind == AFTER and start.sub_seq is None:
            run = tuple(page.records)  # from the start's own continuation: what follows it
        if cap is not None and seq_key(page.records[0]["SequenceNumber"]) > seq_key(cap):
            return ProbeResult(behind_ms=page.behind_ms, run=run, run_next=page.next_iterator)
        end, cont = page.records[-1]["SequenceNumber"], page.next_iterator
        end_at: float | None = arrival_seconds(page.records[-1])
        counted: int | None = len(page.records)  # every record after the start, to the tip
        if not page.caught_up(limit):
            counted = None  # the tip is looked for past records not read
            tip, after_tip, tip_at = await self._beyond(stream, shard, page, cold=cached is None)
            if tip is not None and seq_key(tip) > seq_key(end):
                end, cont, end_at = tip, after_tip, tip_at
        if cap is not None and seq_key(end) > seq_key(cap):
            return ProbeResult(tip=cap, behind_ms=page.behind_ms, run=run, run_next=page.next_iterator)
        self.keep(stream, shard, Position.after(end), cont)
        return ProbeResult(tip=end, behind_ms=page.behind_ms, counted=counted, tip_at=end_at,
                           run=run, run_next=page.next_iterator)

    def _warm_limit(self, key: ShardId) -> int:
        """``Limit`` of a probe reading on from its last tip: about ``warm_bytes`` of the
        shard's records (``WARM_READ_LIMIT`` records while their size is not known)."""
        size = self._shards.state(key).record_bytes
        fit = WARM_READ_LIMIT if not size else max(1, int(self.warm_bytes // size))
        return max(1, min(fit, WARM_READ_RECORDS, self._page_limit))

    async def _beyond(self, stream: str, shard: str, page: Page,
                      cold: bool = False) -> tuple[str | None, str | None, float | None]:
        """The newest record after ``page``, the iterator after it and its arrival: from an ``AT_TIMESTAMP``
        iterator a little before its estimated arrival, widening the window while it comes back
        empty, or reading on from the page once the window reaches it. When the calls waited
        for the shard's budget, the estimate moves on by the wait (and back to where ``page``
        put it when nothing arrived in the moved window). A ``cold`` probe (nothing says the
        shard is being written to: the first look at it) first looks where ``page`` put the tip,
        reading at most a warm page there: a backlog nobody writes to is found in that call
        (or, when the page stopped inside the last burst of records, ``LOOK_READ_ON_MS`` or
        less behind, in one more warm page read on from it) instead of after an empty moved
        window, and on a busy shard (or past that page) the moved window comes next, as it
        would have."""
        last_arrival = arrival_seconds(page.records[-1])
        tip_arrival = last_arrival + page.behind_ms / 1000.0
        seen = time.monotonic()
        window = INITIAL_WINDOW_S
        shifted = False  # a window moved on by the wait came back empty
        key = ShardId(stream, shard)
        while True:
            if tip_arrival - window <= last_arrival:  # the window reached the page: read on from it
                tip, after_tip, tip_at, _, _ = await self._read_to_tip(key, page.next_iterator)
                return tip, after_tip, tip_at
            # The iterator and its page wait for the shard's budget first (a probe's second
            # GetRecords often waits a second): the tip moved on meanwhile, and an estimate made
            # before the wait would have the page read all that arrived during it.
            await self._kinesis.ready(key, (GET_SHARD_ITERATOR, GET_RECORDS))
            moved = 0.0 if shifted or cold else time.monotonic() - seen
            if moved > MOVED_MIN_S:
                since = max(last_arrival, tip_arrival + moved - max(window, min(moved, MOVED_WINDOW_S)))
            else:
                since = tip_arrival - window
            iterator = await self._kinesis.iterator(stream, shard, Position.at_timestamp(_utc(since)))
            looked, cold = cold, False
            limit, pages = (self._warm_limit(key), 1) if looked else (None, MAX_TIP_PAGES)
            tip, after_tip, tip_at, reached, behind = await self._read_to_tip(key, iterator, limit, pages)
            if tip is not None and (reached or not looked):
                return tip, after_tip, tip_at
            if tip is not None and behind <= LOOK_READ_ON_MS:
                # The look stopped a few records short of a tip that is that close (a
                # producer's batch arrives in one millisecond): one more warm page, read on from
                # there, not an empty moved window and a window after it. (One page only: on a
                # busy shard it may wait for the budget while records arrive; short of the tip,
                # the moved window comes next.)
                more, after_more, more_at, reached, _ = await self._read_to_tip(
                    key, after_tip, self._warm_limit(key), 1)
                if reached:
                    return (more, after_more, more_at) if more is not None else (tip, after_tip, tip_at)
            if tip is not None:
                continue  # records arrived while it waited: the moved window next, as when warm
            shifted = shifted or looked  # nothing there: it stays where the page put the tip
            if moved > MOVED_MIN_S:
                shifted = True  # nothing arrived lately: the tip is where the first page said
            else:
                window *= WINDOW_GROWTH

    def _hand_over(self, key: ShardId, start: Position, iterator: str, first: str | None,
                   made: float | None = None) -> None:
        kept = self._shards.state(key).openers
        kept[start.to_str()] = (iterator, first, time.monotonic() if made is None else made)
        while len(kept) > _OPENERS_PER_SHARD:
            kept.popitem(last=False)

    def keep_opener(self, key: ShardId, start: Position, iterator: str, made: float | None = None) -> None:
        """An iterator known to read on right after ``start`` (a page's ``NextShardIterator``
        after that record, which an executor reported), made at ``made`` (monotonic; None:
        now): the range that starts there can read with it. Its first record is not known: an
        executor checks it lies after ``start``."""
        self._hand_over(key, start, iterator, None, made)

    def opener(self, key: ShardId, start: Position) -> tuple[str, str | None] | None:
        """An iterator a probe read from (or an executor reported) at ``start``, and the first
        record found there (None: not known), if recent enough for an executor to read on
        with it."""
        state = self._shards.get(key)
        found = state.openers.get(start.to_str()) if state is not None else None
        if found is None or time.monotonic() - found[2] > HANDED_ITERATOR_TTL_S:
            return None
        return found[0], found[1]

    def forget(self, key: ShardId) -> None:
        """Drop everything kept for a shard that left the query: its whole record."""
        self._kinesis.forget(key)  # (first: its totals count what the record held)
        self._shards.forget(key)

    async def _open(self, stream: str, shard: str, start: Position, limit: int) -> Page:
        """The first page after ``start``, checking that ``start``'s record is still there.
        When the iterator opened at ``start`` itself (not at a record before it), it is kept for
        the range that starts there: its read then needs no ``GetShardIterator`` of its own."""
        opening = opening_position(start)
        extra = 1 if opening != start else 0  # the start's own record comes first
        try:
            iterator = await self._kinesis.iterator(stream, shard, opening)
            page = await self._kinesis.page_at(stream, shard, opening, limit + extra, iterator)
        except ClientError as exc:
            if error_code(exc) != INVALID_ARGUMENT:
                raise
            self._lost(stream, shard, start, None)
            return await self._kinesis.page_at(stream, shard, Position.trim_horizon(), limit, None)
        page.records, landed = check_opening(page.records, start)
        if landed is not None:
            self._lost(stream, shard, start, landed)
        elif not extra and page.records:
            self._hand_over(ShardId(stream, shard), start, iterator, page.records[0]["SequenceNumber"])
        return page

    def _lost(self, stream: str, shard: str, start: Position, landed: str | None) -> None:
        report_data_loss(stream, shard, start, landed, self.fail_on_data_loss)

    async def _read_to_tip(
        self, key: ShardId, iterator: str | None, limit: int | None = None, pages: int = MAX_TIP_PAGES,
    ) -> tuple[str | None, str | None, float | None, bool, int]:
        """Read pages of shard ``key`` (of ``limit`` records, at most ``pages`` of them) until
        the tip; return the last sequence number, the iterator after it, the last record's
        arrival, whether the tip was reached and the last page's ``MillisBehindLatest``."""
        last, last_at, behind = None, None, 0
        limit = self._page_limit if limit is None else limit
        for _ in range(pages):
            if iterator is None:  # the shard ended
                return last, iterator, last_at, True, 0
            page = await self._kinesis.page(key.stream, key.shard, iterator, limit)
            if page.records:
                last, last_at = page.records[-1]["SequenceNumber"], arrival_seconds(page.records[-1])
            iterator, behind = page.next_iterator, page.behind_ms
            if page.caught_up(limit):
                return last, iterator, last_at, True, behind
        return last, iterator, last_at, False, behind


async def probe_all(
    prober: TailProber,
    starts: dict[ShardId, Position],
    caps: dict[ShardId, str] | None = None,
    concurrency: int = 64,
) -> dict[ShardId, ProbeResult]:
    """Probe many shards concurrently (``caps``: the newest record each may end at)."""
    gate = asyncio.Semaphore(concurrency)
    caps = caps or {}

    async def one(key: ShardId, start: Position) -> ProbeResult:
        async with gate:
            return await prober.probe(key.stream, key.shard, start, caps.get(key))

    keys = list(starts)
    results = await asyncio.gather(*(one(key, starts[key]) for key in keys))
    return dict(zip(keys, results, strict=True))


async def settle_all(
    prober: TailProber,
    starts: dict[ShardId, Position],
    caps: dict[ShardId, str] | None = None,
    timeout_s: float = SETTLE_TIMEOUT_S,
    pause_s: float = SETTLE_PAUSE_S,
) -> dict[ShardId, ProbeResult]:
    """:func:`probe_all`, repeated for the shards whose probe crossed only empty pages (each
    time on from where the last stopped) until every shard's tip, or that it has none, is
    known; shards still pending after ``timeout_s`` stay ``pending``."""
    results = await probe_all(prober, starts, caps)
    deadline = time.monotonic() + timeout_s
    while True:
        pending = {key: starts[key] for key, r in results.items() if r.pending}
        if not pending or time.monotonic() >= deadline:
            return results
        await asyncio.sleep(pause_s)
        results.update(await probe_all(prober, pending, caps))


def _utc(epoch_seconds: float) -> datetime:
    return datetime.fromtimestamp(epoch_seconds, tz=timezone.utc)
