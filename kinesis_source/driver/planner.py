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
from kinesis_source.driver.handout import Booking, HandOut
from kinesis_source.driver.limits import BudgetPlanner
from kinesis_source.driver.listing import ShardListing
from kinesis_source.driver.probe import SETTLE_PAUSE_S, SETTLE_TIMEOUT_S, ProbeResult, TailProber
from kinesis_source.driver.reports import TipListener, default_host, is_loopback
from kinesis_source.driver.runtime import LoopThread
from kinesis_source.driver.shards import ShardStates
from kinesis_source.driver.start import resolve_positions
from kinesis_source.driver.tips import TipTable
from kinesis_source.errors import report_shard_gone
from kinesis_source.lineage import gone_shards, probe_starts, retire_finished
from kinesis_source.option_values import InitialPosition
from kinesis_source.options import SourceOptions
from kinesis_source.positions import AFTER, Offset, Position, ShardId, ShardRange
from kinesis_source.tip_reports import ReportAddress

__all__ = ["Planner", "Target", "plan_ranges"]

log = logging.getLogger(__name__)

# How long the first answer for newly tracked shards waits for their first probe.
FIRST_PROBE_TIMEOUT_S = 60.0
# Under Trigger.AvailableNow, how long a batch waits for the table between looks.
_TARGET_WAIT_S = 0.5

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
        self.shards = ShardStates()  # everything known of each shard: the one owner
        self.budget = CallBudget({
            GET_RECORDS: opts.get_records_per_shard_per_second,
            GET_SHARD_ITERATOR: opts.get_shard_iterator_per_shard_per_second,
        }, self.shards)
        self.byte_budget = ByteBudget(opts.max_read_rate_per_shard, self.shards)
        self._prober: TailProber | None = None
        self._tips: TipTable | None = None
        self._listing = ShardListing(opts, self._client)
        self._lag: dict[str, dict] = {}  # by "<stream>/<shardId>": Spark shows it as JSON
        self._last: LastAnswer | None = None  # what the next answer may be patched from
        self._identity: dict[str, str] | None = None
        self._target: Target | None = None
        self._listener: TipListener | None = None
        self._turn = 0  # rotates which shard a limited batch serves first
        self._handout = HandOut(opts, self.shards, self.budget, self.byte_budget)
        self._answer_s = 0.0  # how long the last latest_offset took
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
                self._kinesis, self._opts.max_records_per_fetch, self._opts.fail_on_data_loss, self.shards
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
                byte_budget=self.byte_budget,
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
            self._listener = TipListener(self._opts.tip_report_host or default_host(), tips.reported.apply)
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
        """True when ``sid``'s new records wait for a later batch (``HandOut.held``)."""
        return self._handout.held(sid, start, self._tips, self._prober)

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
        tips = self._tip_table()  # (a batch replayed after a restart is handed out first)
        if self._opts.consumer_mode == "efo":
            self._handout.subscribing(ranges, tips, address)
            return {}, address
        return self._handout.hand_over(ranges, tips, self._prober_ready(), address, self._target), address

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
            "executorReadsBooked": self._handout.booked,
            # ranges whose every record the driver had read (probes, executors' reports) and
            # handed to the executor in the partition, and how many records they held
            "rangesCarried": self._handout.carried_ranges,
            "recordsCarried": self._handout.carried_records,
            "executorBytesRead": self._tips.reported.read_bytes if self._tips else 0,
            "executorBytesExtra": self._tips.reported.extra_bytes if self._tips else 0,
            # GetRecords the shards refused for throughput (each retried when its byte model
            # said): the driver's probes, and executor reads as reported
            "throttledProbes": self.byte_budget.throttles(),
            "throttledReads": self._tips.reported.throttled if self._tips else 0,
            "tipReports": self._tips.reports if self._tips else 0,
            "tipReportsRefused": self._listener.refused if self._listener else 0,
            # booked reads whose report never came (executors that cannot reach tipReportHost)
            "tipReportsMissing": self._handout.missing,
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
