"""Driver-side planning: initial and latest offsets, and the exact ranges of a batch.

Where each shard's batch ends comes from the tip table (``driver/tips.py``), which the tail
probe (``driver/probe.py``) keeps fresh in the background within the per-shard call budget
(``driver/budget.py``): in steady state ``latestOffset`` makes no AWS call. The planner's
coroutines run on an event loop in a thread of its own (``driver/runtime.py``), so that the
background work and shard discovery (``driver/listing.py``) go on between Spark's calls.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Collection, Mapping
from typing import Any

from kinesis_source.aws.clients import AwsSettings
from kinesis_source.aws.kinesis import AsyncKinesis, ShardInfo
from kinesis_source.driver.answers import LastAnswer, lag_entry
from kinesis_source.driver.available_now import Target, find_target
from kinesis_source.driver.budget import GET_RECORDS, GET_SHARD_ITERATOR, ByteBudget, CallBudget, PacedKinesis
from kinesis_source.driver.limits import BudgetPlanner
from kinesis_source.driver.listing import ShardListing
from kinesis_source.driver.probe import SETTLE_PAUSE_S, SETTLE_TIMEOUT_S, ProbeResult, TailProber
from kinesis_source.driver.reports import TipListener, default_host, is_loopback
from kinesis_source.driver.runtime import LoopThread
from kinesis_source.driver.start import resolve_positions
from kinesis_source.driver.tips import TipTable
from kinesis_source.errors import report_shard_gone
from kinesis_source.lineage import gone_shards, probe_starts, retire_finished
from kinesis_source.option_values import InitialPosition
from kinesis_source.options import SourceOptions
from kinesis_source.positions import AFTER, Offset, Position, ShardId, ShardRange
from kinesis_source.read_rate import RateState
from kinesis_source.tip_reports import ReportAddress, TipReport

__all__ = ["Planner", "Target", "plan_ranges"]

log = logging.getLogger(__name__)

# The longest the driver holds its probes of a shard that executors read and will report on.
# The batch's end releases them (Spark asks for the next end only then; a report that has not
# come will not), so this is a fallback only. Until then a probe would find nothing the report
# does not bring, and would spend the call budget the read uses: after its second page a read
# spaces its pages by the shard's whole budget.
READ_HOLD_S = 3600.0
# How long the first answer for newly tracked shards waits for their first probe.
FIRST_PROBE_TIMEOUT_S = 60.0
# How far an executor's reported call times may lie before its booking (clock skew).
MAX_CLOCK_SKEW_S = 5.0
# An unbooked read's calls (a planned read Spark ran again) count from at most this long ago:
# older ones have left every call window.
UNBOOKED_LOOKBACK_S = 10.0
# Reads without a report (and none ever received) before the driver warns that executors
# cannot reach its listener.
MISSING_WARN = 3
# A shard's new records join a batch only if its executor read can start within this.
HOLD_SLACK_S = 0.05
# Fan-out: Kinesis refuses a shard's subscription within 5 s of its last one; a little more, as
# the driver learns the last one's time from another process's clock.
SUBSCRIBE_GAP_S = 5.1
# Under Trigger.AvailableNow, how long a batch waits for the table between looks.
_TARGET_WAIT_S = 0.5

# What an executor read gets from planning: the iterator and first record the probe found at
# the range's start (or None), the wall-clock time its first call is booked for, how many
# records the range holds (None: not known), the shard's byte model (None: the read makes no
# call), when the range's end record arrived (epoch seconds; None: not known, or the size is),
# the range's first records, which the driver already read (driver/carried.py), and the
# wall-clock time the shard's budget has room for the read's second call (None: not held).
Booking = tuple[tuple[str, str | None] | None, float, int | None, RateState | None, float | None,
                tuple[dict, ...], float | None]


class Planner:
    """Plans offsets and ranges for one query run; lives in Spark's driver-side Python helper.

    Holds the event loop thread and an aiobotocore client made on first use (the reader that
    owns the planner must stay picklable until then), the shard listing, the tip table and the
    call budget.
    """

    def __init__(self, opts: SourceOptions, kinesis: AsyncKinesis | None = None) -> None:
        """``kinesis``: a client to use instead of one made from the options (tests; its calls
        are paced by the budget only if it is a :class:`PacedKinesis`)."""
        self._opts = opts
        self._loop = LoopThread("kinesis-ddb-planner")
        self._kinesis: AsyncKinesis | None = kinesis
        self.budget = CallBudget({
            GET_RECORDS: opts.get_records_per_shard_per_second,
            GET_SHARD_ITERATOR: opts.get_shard_iterator_per_shard_per_second,
        })
        self.byte_budget = ByteBudget(opts.max_read_rate_per_shard, self.budget.lock)
        self._prober: TailProber | None = None
        self._tips: TipTable | None = None
        self._listing = ShardListing(opts, self._client)
        self._lag: dict[str, dict] = {}  # by "<stream>/<shardId>": Spark shows it as JSON
        self._last: LastAnswer | None = None  # what the next answer may be patched from
        self._identity: dict[str, str] | None = None
        self._target: Target | None = None
        self._listener: TipListener | None = None
        # executor reads not yet reported: the range's end and its booked calls, by shard
        self._bookings: dict[ShardId, tuple[str, dict[str, list[float]]]] = {}
        self._subscribed: dict[ShardId, float] = {}  # fan-out: each shard's last subscription (wall clock)
        self._turn = 0  # rotates which shard a limited batch serves first
        self._booked = 0
        self._missing = 0  # booked reads whose report had not come when the shard was booked again
        self._carried_ranges = self._carried_records = 0  # ranges (and records) executors got whole
        self._answer_s = 0.0  # how long the last latest_offset took
        self._read_bytes = self._extra_bytes = 0  # what executors reported reading
        self._executor_throttles = 0  # executor reads' calls refused for throughput, as reported
        self.probes = 0

    # -- runtime -------------------------------------------------------------------------

    def kinesis(self) -> AsyncKinesis:
        """The run's Kinesis client, made now if it was not yet."""
        return self._loop.run(self._client())

    async def _client(self) -> AsyncKinesis:
        if self._kinesis is None:
            settings = AwsSettings.for_kinesis(self._opts).failing_fast().pacing_reads()
            self._kinesis = PacedKinesis(
                await settings.aio_client("kinesis"), self.budget, self.byte_budget, settings.max_retries + 1,
                dict(settings.stream_arns),
            )
        if self._prober is None:
            self._prober = TailProber(
                self._kinesis, self._opts.max_records_per_fetch, self._opts.fail_on_data_loss
            )
        return self._kinesis

    def _prober_ready(self) -> TailProber:
        assert self._prober is not None, "client not created"
        return self._prober

    def _tip_table(self) -> TipTable:
        """The tip table; made with the background tasks that keep it and the listing fresh."""
        if self._tips is None:
            opts = self._opts
            tips = self._tips = TipTable(
                self._prober_ready(),
                self.budget,
                opts.min_probe_interval_ms / 1000,
                opts.max_idle_probe_interval_ms / 1000,
                on_ended=self._listing.stale,
                carry=opts.consumer_mode != "efo",
            )

            def failed(exc: BaseException) -> None:
                tips.error = exc  # raised by the next latestOffset

            self._loop.spawn(tips.run(), failed)
            self._loop.spawn(self._listing.discover(), failed)
        return self._tips

    async def _report_address(self) -> ReportAddress | None:
        """Where executors send their tip reports (the listener starts on first use); None
        with ``tipReports=false`` or when no listener could be started (then the driver probes
        every shard itself)."""
        if not self._opts.tip_reports:
            return None
        if self._listener is None:
            tips = self._tip_table()

            def apply(reports: list[TipReport]) -> None:
                for tip in reports:
                    tips.report(tip)
                    booked = self._settle(tip) if tip.watch is None else True
                    if tip.rate is not None and booked:
                        self.byte_budget.adopt(tip.shard, tip.rate)
                    elif tip.rate is not None:
                        # A read nobody booked: Spark ran a planned read again (a batch's
                        # partitions re-executed by another action, a speculative copy). It
                        # started from a state that missed the first run's bytes, so what it
                        # learnt of others may be that run: only its bytes are kept.
                        self.byte_budget.charge(tip.shard, tip.read_bytes)
                    self._executor_throttles += tip.throttled
                    if tip.subscribed_at is not None:
                        at = min(tip.subscribed_at, time.time() + MAX_CLOCK_SKEW_S)
                        if tip.watch is not None:  # (a watch goes on with its read's subscription)
                            at = max(at, self._subscribed.get(tip.shard, 0.0))
                        self._subscribed[tip.shard] = at
                    self._read_bytes += tip.read_bytes
                    self._extra_bytes += tip.extra_bytes

            self._listener = TipListener(self._opts.tip_report_host or default_host(), apply)
            if not self._opts.tip_report_host and is_loopback(self._listener.host):
                log.warning("executors' tip reports go to %s, a loopback address: executors on other "
                            "hosts cannot reach it, and the driver then probes every shard itself. "
                            "On a cluster, set option tipReportHost to the driver's address that "
                            "executors reach (spark.driver.host)", self._listener.host)
        if self._listener.address is None:
            try:
                await self._listener.start()
            except OSError as exc:
                log.warning("cannot listen for executors' tip reports on %s (%s): the driver probes "
                            "every shard itself; set tipReportHost, or tipReports=false",
                            self._listener.host, exc)
                self._opts = dataclasses.replace(self._opts, tip_reports=False)
                return None
        return self._listener.address

    def _settle(self, tip: TipReport) -> bool:
        """The shard's ledger gets the reported read's actual call times in place of its
        booking (times from the executor's clock, kept within what could be true here); a read
        nobody booked (Spark ran a planned read again) adds its calls. Returns whether the read
        was booked."""
        # (a late report of an earlier range does not take the booking of the shard's next one)
        found = self._bookings.get(tip.shard)
        booked = None
        if found is not None and found[0] == tip.end:
            booked = self._bookings.pop(tip.shard)[1]
        if not tip.calls:
            return booked is not None
        now, wall = time.monotonic(), time.time()
        spent = [t for times in booked.values() for t in times] if booked else []
        earliest = (min(spent) if spent else now - UNBOOKED_LOOKBACK_S) - MAX_CLOCK_SKEW_S
        for op, times in tip.calls.items():
            actual = [min(now, max(earliest, now - (wall - t))) for t in times]
            self.budget.settle(tip.shard, op, booked.get(op, []) if booked else [], actual, tip.made.get(op))
        return booked is not None

    def close(self) -> None:
        """Stop the background work, close the client and the event loop."""

        async def close_client() -> None:
            if self._listener is not None:
                self._listener.close()
            if self._kinesis is not None:
                await self._kinesis.close()
                self._kinesis = None

        self._loop.close(close_client)

    # -- shards --------------------------------------------------------------------------

    def shard_ids(self) -> set[ShardId]:
        """Every listed shard (lists now if not yet listed)."""
        self._loop.run(self._listing.get())
        return self._listing.ids()

    def hash_ranges(self) -> dict[ShardId, tuple[int, int] | None]:
        """Each listed shard's (first, last) hash key (lists now if not yet listed); None where
        the listing gave no range."""
        self._loop.run(self._listing.get())
        return self._listing.hash_ranges()

    def streams_entering(self, start: Offset) -> list[str]:
        """The query's streams that have shards (listing now if none was made yet) but none
        in ``start``: streams added to a query that already ran. Asked on every
        ``latestOffset``, so the last listing serves (discovery refreshes it)."""
        if not self._listing.shards:
            self._loop.run(self._listing.get())
        return self._listing.entering(start.streams)

    def listed(self) -> Mapping[str, list[ShardInfo]]:
        """The shard listing as last fetched (no call; empty before the first listing)."""
        return self._listing.view()

    def stream_identities(self) -> dict[str, str]:
        """Each stream's creation time: a stream re-created under its name gets a new one.
        Asked once per run (the checkpointer compares and stores it)."""
        if self._identity is None:
            self._identity = self._loop.run(self._listing.identities())
        return self._identity

    # -- offsets -------------------------------------------------------------------------

    def resolve_initial(
        self, spec: InitialPosition, streams: Collection[str] | None = None
    ) -> Offset:
        """Positions per listed shard for an initial position (LATEST probes each tip); with
        ``streams``, for the shards of those streams only."""
        return self._loop.run(self._resolve_initial(spec, streams))

    async def _resolve_initial(
        self, spec: InitialPosition, streams: Collection[str] | None
    ) -> Offset:
        await self._client()
        listing = await self._listing.get(force=True)
        return await resolve_positions(spec, listing, self._prober_ready(), streams)

    def latest_offset(self, start: Offset, max_records: int | None = None) -> Offset:
        """The exact end of the next batch: every shard's newest known record after ``start``
        (from the tip table: no AWS call in steady state), or, with ``max_records``, a fair cut
        holding at most that many user records (``driver/limits.py``, which reads on the
        driver). Under ``Trigger.AvailableNow`` no shard goes past its target.

        Returns ``start`` itself when nothing new is known, so idle streams run no batches.
        """
        began = time.perf_counter()
        try:
            end = self._patched(start, max_records)
            if end is not None:
                return end
            return self._loop.run(self._probe(start, max_records))
        finally:
            self._answer_s = time.perf_counter() - began

    def _patched(self, start: Offset, max_records: int | None) -> Offset | None:
        """The end derived from the last answer (``driver/answers.py``), or None when only the
        full computation can answer.

        Computed in the caller's thread, not on the loop: at 1,000 shards the loop is busy with
        probes (a few ms of CPU each), and an answer queued behind them waited for them. The
        table and the budget share one lock (each shard's entry is read whole under it); what
        only the loop may do (scheduling probes) is posted to it."""
        tips, listing = self._tips, self._listing.current()
        if max_records is not None or self._target is not None or self._last is None or tips is None:
            return None
        if listing is None:
            return None
        self._loop.post(tips.batch_over)
        tips.raise_error()
        end = self._last.patch(start, listing, tips, self._held)
        if end is not None:
            self.probes += 1
        return end

    def prepare_available_now(self) -> Target:
        """Fix the target of a ``Trigger.AvailableNow`` run: every open shard's newest record
        now. Later ends never pass it, so the run stops once every shard reached it."""
        self._target = target = self._loop.run(self._find_target())
        log.info(
            "Trigger.AvailableNow: reading up to the newest record of %d open shard(s), and "
            "%d closed shard(s) to their end",
            len(target.caps), len(target.closed),
        )
        return target

    async def _find_target(self) -> Target:
        await self._client()
        target = await find_target(await self._listing.get(force=True), self._prober_ready())
        self._tip_table().seed(target.found)
        return target

    async def _probe(self, start: Offset, max_records: int | None) -> Offset:
        await self._client()
        listing = await self._listing.get()
        if self._tips is not None:
            self._tips.batch_over()
        self._last = None  # (its patch was tried first, and it took the table's changes)
        positions = dict(start.shards)
        for sid in gone_shards(listing, start.shards):
            report_shard_gone(sid.stream, sid.shard, start.shards[sid], self._opts.fail_on_data_loss)
            del positions[sid]
        starts = probe_starts(listing, positions)
        caps: dict[ShardId, str] = {}
        if self._target is not None:
            starts, caps = self._target.bound(starts)
        results = await self._ends(starts, caps, max_records)
        if self._target is not None:
            # Spark ends a Trigger.AvailableNow run at the first batch without new data: while
            # shards have records left within the target, wait for the table to find them.
            deadline = time.monotonic() + SETTLE_TIMEOUT_S
            while starts and not _moved(results) and time.monotonic() < deadline:
                if max_records is not None:
                    await asyncio.sleep(SETTLE_PAUSE_S)
                else:
                    await self._tip_table().progress(_TARGET_WAIT_S)
                results = await self._ends(starts, caps, max_records)
        # A run's first answer holds no shard: it may be its only batch (Trigger.Once, and
        # AvailableNow on pyspark < 4.2, plan one batch and stop), and a held shard's records
        # would wait for a batch that never comes. Its reads wait for the budget in the task.
        holding = self.probes > 0
        self.probes += 1
        lag = {}
        paced = max_records is None and self._target is None
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
            self._last = LastAnswer.of(start, end, listing, starts, results, lag)
        self._lag = lag
        return end

    def _held(self, sid: ShardId, start: Position) -> bool:
        """True when an executor read of ``sid`` from ``start`` could not start now (its share
        of the call budget is spent: ``GetRecords``, and ``GetShardIterator`` when no probe left
        an iterator there; or the shard's byte model holds less than a page is worth): its new
        records wait for a later batch, instead of a task that sleeps until the budget lets it
        read (and a batch that lasts as long)."""
        if self._opts.consumer_mode == "efo":
            # Subscriptions do not spend the polling budget, but Kinesis refuses a shard's next
            # one within 5 s of the last: the range waits here (probes go on, so its end is
            # fresh when it goes) instead of in a task retrying refused calls.
            return time.time() < self._subscribed.get(sid, 0.0) + SUBSCRIBE_GAP_S
        if self._tips is not None and self._tips.carries(sid, start):
            return False  # the range goes to its executor whole: no call to wait for
        now = time.monotonic()
        free = self.budget.free_at(sid, GET_RECORDS, now=now)
        if self._prober is not None and self._prober.opener(sid, start) is None:
            free = max(free, self.budget.free_at(sid, GET_SHARD_ITERATOR, now=now))
        bytes_wait = self.byte_budget.wait_s(sid, self._opts.executor_page_interval_s)
        held = free > now + HOLD_SLACK_S or bytes_wait > HOLD_SLACK_S
        if held and self._tips is not None:
            self._tips.hold(sid)
        return held

    async def _ends(
        self,
        starts: dict[ShardId, Position],
        caps: dict[ShardId, str],
        max_records: int | None,
    ) -> dict[ShardId, ProbeResult]:
        """Each shard's end for the next batch: its tip, or a fair cut under a read limit."""
        tips = self._tip_table()
        if max_records is not None:
            tips.track({}, forget=False)  # a limited batch reads its records itself (with the probe's iterators)
            budget = BudgetPlanner(
                await self._client(), self._prober_ready(), self._opts.max_records_per_fetch
            )
            results = await budget.plan(starts, max_records, self._turn, caps)
            if any(r.tip for r in results.values()):
                self._turn += 1  # per batch with data, so every shard in turn is served first
            return results
        fresh = tips.track(starts)
        if fresh:
            await tips.settled(fresh, FIRST_PROBE_TIMEOUT_S)
        return tips.answers(starts, caps)

    def hand_over(self, ranges: list[ShardRange]) -> tuple[dict[ShardId, Booking], ReportAddress | None]:
        """For each range an executor will read: the iterator the probe left at its start (if
        fresh) and the wall-clock time before which the read must not start, its calls booked
        in the shard's budget (so driver probes and executor reads of a shard never exceed it
        together); and where the executors report what they saw past the ranges' ends (the
        driver does not probe those shards until then)."""
        return self._loop.run(self._hand_over(ranges))

    async def _hand_over(self, ranges: list[ShardRange]) -> tuple[dict[ShardId, Booking], ReportAddress | None]:
        await self._client()
        address = await self._report_address()
        tips = self._tips
        if self._opts.consumer_mode == "efo":
            if address is not None and tips is not None:
                tips.reading([r.shard for r in ranges], time.monotonic() + READ_HOLD_S)
            # The read subscribes after now: its report brings the actual time.
            wall = time.time()
            for rng in ranges:
                self._subscribed[rng.shard] = max(self._subscribed.get(rng.shard, 0.0), wall)
            return {}, address  # subscriptions do not spend the polling budget
        out: dict[ShardId, Booking] = {}
        reading = []
        now, wall = time.monotonic(), time.time()
        for rng in ranges:
            carried = tips.carry(rng.shard, rng.start, rng.end_seq) if tips is not None else None
            if tips is not None:
                tips.hold(rng.shard, False)
            if carried is not None and carried[1]:
                # every record of the range is in the partition: the read makes no call, sends no
                # report, and the driver's probes go on finding the shard's next records
                out[rng.shard] = (None, 0.0, None, None, None, carried[0], None)
                self._carried_ranges += 1
                self._carried_records += len(carried[0])
                continue
            reading.append(rng.shard)
            prefix: tuple[dict, ...] = ()
            opener = self._prober_ready().opener(rng.shard, rng.start)
            if carried is not None:
                prefix = carried[0]
                opener = (carried[2], None) if carried[2] is not None else None
            if rng.shard in self._bookings and address is not None:
                self._report_missing(rng.shard)
            at, calls = self.budget.book_read(rng.shard, opener is None, now)
            self._bookings[rng.shard] = (rng.end_seq, calls)
            self._booked += 1
            # The driver's probes of the shard stop while it is read (the report resumes them):
            # after its first call the read has the whole budget, once the probes before it
            # have left the window. (Asked from now, not from the booking, which may lie ahead:
            # a time before the read's first call is raised by the read's own spacing.)
            second = None
            if address is not None and tips is not None:
                second = wall + (self.budget.free_at(rng.shard, GET_RECORDS, now=now) - now)
            records = end_at = None
            if self._tips is not None:
                records = self._tips.read_size(rng.shard, rng.start, rng.end_seq)
                self._tips.handed(rng.shard, rng.start, rng.end_seq)
                if records is None:
                    end_at = self._tips.arrival(rng.shard, rng.end_seq)
            if end_at is None and records is None and self._target is not None:
                end_at = self._target.arrival(rng.shard, rng.end_seq)
            rate = self.byte_budget.hand_out(rng.shard, records - len(prefix) if records else records)
            out[rng.shard] = (opener, wall + (at - now), records, rate, end_at, prefix, second)
        if address is not None and tips is not None:
            tips.reading(reading, time.monotonic() + READ_HOLD_S)
        return out, address

    def _report_missing(self, shard: ShardId) -> None:
        """The shard's last read was booked, and its report has not come by its next batch
        (batches run one after another, and a read reports before its task ends)."""
        self._missing += 1
        if self._missing == MISSING_WARN and self._tips is not None and not self._tips.reports:
            address = self._listener.address if self._listener is not None else None
            log.warning("%d executor reads sent no tip report to the driver at %s (shard %s the "
                        "last), and none ever arrived: executors cannot reach that address, and "
                        "the driver probes every shard itself. Set option tipReportHost to the "
                        "driver's address that executors reach (spark.driver.host), or "
                        "tipReports=false", self._missing, address, shard)

    def stats(self) -> dict[str, Any]:
        """Driver-side cost so far (``latestOffset`` answers and the last one's time, background
        probes, AWS calls, records fetched, seconds calls waited for the budget, executor reads
        booked, the data bytes executors reported reading and, of them, outside their ranges)
        and, per shard of the last answer, the tip and how far behind it the batch started."""
        k = self._kinesis
        return {
            "probes": self.probes,
            "lastAnswerMs": round(self._answer_s * 1000, 2),
            "backgroundProbes": self._tips.probes if self._tips else 0,
            "driverCalls": k.calls if k else 0,
            "driverRecordsFetched": k.records_fetched if k else 0,
            "budgetWaitS": round(k.waited_s, 3) if isinstance(k, PacedKinesis) else 0.0,
            "executorReadsBooked": self._booked,
            # ranges whose every record the driver had read (probes, executors' reports) and
            # handed to the executor in the partition, and how many records they held
            "rangesCarried": self._carried_ranges,
            "recordsCarried": self._carried_records,
            "executorBytesRead": self._read_bytes,
            "executorBytesExtra": self._extra_bytes,
            # GetRecords the shards refused for throughput (each retried when its byte model
            # said): the driver's probes, and executor reads as reported
            "throttledProbes": self.byte_budget.throttles(),
            "throttledReads": self._executor_throttles,
            "tipReports": self._tips.reports if self._tips else 0,
            "tipReportsRefused": self._listener.refused if self._listener else 0,
            # booked reads whose report never came (executors that cannot reach tipReportHost)
            "tipReportsMissing": self._missing,
            "watchedShards": self._tips.watched_count() if self._tips else 0,
            "shards": self._last.lag if self._last is not None else self._lag,
        }


def plan_ranges(start: Offset, end: Offset) -> list[ShardRange]:
    """One exact range per shard whose position moved to after a record.

    A shard absent from ``start`` starts at TRIM_HORIZON (a shard found after the query
    started holds only new data), so a range is always derived from the two offsets alone and a
    replayed batch reads the same records. A stream with no shard at all in ``start`` is
    entering the offset at its start positions (a stream added to the query): nothing of it
    is read in that batch.
    """
    ranges = []
    for sid in sorted(end.shards, key=str):  # partitions in the offset's (serialized) order
        to = end.shards[sid]
        frm = start.shards.get(sid, Position.trim_horizon())
        if to.kind != AFTER or to == frm:
            continue
        if sid.stream not in start.streams:
            continue
        assert to.seq is not None
        ranges.append(ShardRange(sid.stream, sid.shard, frm, to.seq))
    return ranges


def _moved(results: Mapping[ShardId, ProbeResult]) -> bool:
    """True when some shard has a new end (a record, its end, or that it is gone)."""
    return any(r.tip or r.ended or r.gone for r in results.values())
