"""Driver-side planning: initial and latest offsets, and the exact ranges of a batch.

Where each shard's batch ends comes from the tip table (``driver/tips.py``), which the tail
probe (``driver/probe.py``) keeps fresh in the background within the per-shard call budget
(``driver/budget.py``): in steady state ``latestOffset`` makes no AWS call. The planner's
coroutines run on an event loop in a thread of its own (``driver/runtime.py``), so that the
background work and shard discovery (``driver/listing.py``) go on between Spark's calls.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from kinesis_source.aws.clients import AwsSettings
from kinesis_source.aws.kinesis import AsyncKinesis, ShardInfo
from kinesis_source.driver.available_now import Target, find_target
from kinesis_source.driver.budget import GET_RECORDS, GET_SHARD_ITERATOR, ByteBudget, CallBudget, PacedKinesis
from kinesis_source.driver.feeds import Feeds
from kinesis_source.driver.handout import Booking, HandOut
from kinesis_source.driver.latest import LatestOffsets
from kinesis_source.driver.listing import ShardListing
from kinesis_source.driver.probe import TailProber
from kinesis_source.driver.reports import TipListener, default_host, is_loopback
from kinesis_source.driver.runtime import LoopThread
from kinesis_source.driver.shards import ShardStates
from kinesis_source.driver.start import resolve_positions
from kinesis_source.driver.tips import TipTable, warm_bytes
from kinesis_source.option_values import InitialPosition
from kinesis_source.options import SourceOptions
from kinesis_source.positions import AFTER, Offset, Position, ShardId, ShardRange
from kinesis_source.tip_reports import ReportAddress

__all__ = ["Planner", "Target", "plan_ranges"]

log = logging.getLogger(__name__)


@dataclass
class Parts:
    """The parts that need the run's Kinesis client, made together on first use (tests and
    tools look into them as ``Planner.parts``)."""

    kinesis: AsyncKinesis
    prober: TailProber
    tips: TipTable
    handout: HandOut
    latest: LatestOffsets
    feeds: Feeds | None = None  # fan-out with the driver's subscriptions (efoSubscriptions=query)
    started: bool = False  # the background probing and discovery run


class Planner:
    """Plans offsets and ranges for one query run; lives in Spark's driver-side Python helper.

    Wires the run's parts: the event loop thread, the shard listing, the shards' records and
    their budgets, and, once the aiobotocore client is made (on first use), the tail probe, the
    tip table, the hand-out and the ``latestOffset`` answers.
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
        self._listing = ShardListing(opts, self._client)
        self.parts: Parts | None = None
        self._identity: dict[str, str] | None = None
        self._listener: TipListener | None = None
        self._answer_s = 0.0  # how long the last latest_offset took

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
        return self._kinesis

    async def _made(self) -> Parts:
        """The parts, made now if they were not yet (on the loop)."""
        if self.parts is None:
            opts, kinesis = self._opts, await self._client()
            prober = TailProber(kinesis, opts.max_records_per_fetch, opts.fail_on_data_loss, self.shards)
            tips = TipTable(prober, self.budget, opts.min_probe_interval_ms / 1000,
                            opts.max_idle_probe_interval_ms / 1000, on_ended=self._listing.stale,
                            carry=opts.consumer_mode != "efo", byte_budget=self.byte_budget)
            handout = HandOut(opts, self.shards, self.budget, self.byte_budget, tips, prober)
            latest = LatestOffsets(opts, self._loop, kinesis, self._listing, prober, tips, handout)
            feeds = None
            if opts.holds_subscriptions:
                feeds = tips.feeds = Feeds(self.shards, tips.rounds, AwsSettings.for_kinesis(opts).failing_fast(),
                                           opts.subscribe_timeout_ms / 1000, self._listing.stale)
            self.parts = Parts(kinesis, prober, tips, handout, latest, feeds)
        return self.parts

    def subscribe_with(self, arns: Mapping[str, str]) -> None:
        """Fan-out with the driver's subscriptions: the streams' consumers (registered by the
        caller) are known, so the shards the table tracks are subscribed to."""
        parts = self.parts
        if parts is None or parts.feeds is None or parts.feeds.arns != dict(arns):
            self._loop.run(self._subscribe_with(dict(arns)))

    async def _subscribe_with(self, arns: dict[str, str]) -> None:
        parts = await self._made()
        if parts.feeds is not None:
            parts.feeds.use(arns)

    async def _running(self) -> Parts:
        """The parts, with the background tasks that keep the tip table and the listing fresh."""
        parts = await self._made()
        if not parts.started:
            parts.started = True
            tips = parts.tips

            def failed(exc: BaseException) -> None:
                tips.error = exc  # raised by the next latestOffset

            self._loop.spawn(tips.run(), failed)
            self._loop.spawn(self._listing.discover(), failed)
        return parts

    async def _report_address(self, tips: TipTable) -> ReportAddress | None:
        """Where executors send their tip reports (the listener starts on first use); None
        with ``tipReports=false`` or when no listener could be started (then the driver probes
        every shard itself)."""
        if not self._opts.tip_reports:
            return None
        if self._listener is None:
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
            if self.parts is not None and self.parts.feeds is not None:
                await self.parts.feeds.close()
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
        parts = await self._made()
        listing = await self._listing.get(force=True)
        _first_looks(parts.prober, listing)
        return await resolve_positions(spec, listing, parts.prober, streams)

    def latest_offset(self, start: Offset, max_records: int | None = None) -> Offset:
        """The exact end of the next batch: every shard's newest known record after ``start``
        (from the tip table: no AWS call in steady state), or, with ``max_records``, a fair cut
        holding at most that many user records (``driver/limits.py``, which reads on the
        driver). Under ``Trigger.AvailableNow`` no shard goes past its target.

        Returns ``start`` itself when nothing new is known, so idle streams run no batches.
        See ``driver/latest.py``.
        """
        began = time.perf_counter()
        try:
            parts = self.parts
            end = parts.latest.patched(start, max_records) if parts is not None else None
            if end is not None:
                return end
            return self._loop.run(self._full(start, max_records))
        finally:
            self._answer_s = time.perf_counter() - began

    async def _full(self, start: Offset, max_records: int | None) -> Offset:
        parts = await self._running()
        return await parts.latest.full(start, max_records)

    def prepare_available_now(self) -> Target:
        """Fix the target of a ``Trigger.AvailableNow`` run: every open shard's newest record
        now. Later ends never pass it, so the run stops once every shard reached it."""
        target = self._loop.run(self._find_target())
        log.info(
            "Trigger.AvailableNow: reading up to the newest record of %d open shard(s), and "
            "%d closed shard(s) to their end",
            len(target.caps), len(target.closed),
        )
        return target

    async def _find_target(self) -> Target:
        parts = await self._running()
        if parts.feeds is not None:
            parts.feeds.stop_all()
        listing = await self._listing.get(force=True)
        _first_looks(parts.prober, listing)
        target = await find_target(listing, parts.prober)
        parts.tips.seed(target.found)
        parts.latest.target = target
        return target

    def hand_over(self, ranges: list[ShardRange]) -> tuple[dict[ShardId, Booking], ReportAddress | None]:
        """For each range an executor will read: the iterator the probe left at its start (if
        fresh) and the wall-clock time before which the read must not start, its calls booked
        in the shard's budget (so driver probes and executor reads of a shard never exceed it
        together); and where the executors report what they saw past the ranges' ends (the
        driver does not probe those shards until then). See ``driver/handout.py``."""
        return self._loop.run(self._hand_over(ranges))

    async def _hand_over(self, ranges: list[ShardRange]) -> tuple[dict[ShardId, Booking], ReportAddress | None]:
        parts = await self._running()  # (a batch replayed after a restart is handed out first)
        address = await self._report_address(parts.tips)
        if parts.feeds is not None:
            return parts.handout.hand_over_held(ranges, address, parts.feeds), address
        if self._opts.consumer_mode == "efo":
            parts.handout.subscribing(ranges, address)
            return {}, address
        return parts.handout.hand_over(ranges, address, parts.latest.target), address

    def stats(self) -> dict[str, Any]:
        """Driver-side cost so far (``latestOffset`` answers and the last one's time, background
        probes, AWS calls, records fetched, seconds calls waited for the budget, executor reads
        booked, the data bytes executors reported reading and, of them, outside their ranges)
        and, per shard of the last answer, the tip and how far behind it the batch started."""
        return _stats(self.parts, self._kinesis, self.byte_budget, self._listener, self._answer_s)


def _first_looks(prober: TailProber, listing: Mapping[str, list[ShardInfo]]) -> None:
    """Probes from a start before the table tracks the shards (LATEST, an AvailableNow target)
    look at each tip with a page as large as the table's first probes of these shards would
    read: at one shard, 64 KB finds the tip of a backlog written in batches in that call, where
    10 records stopped short and cost a call more (a second of the shard's budget)."""
    prober.warm_bytes = warm_bytes(sum(not s.is_closed for shards in listing.values() for s in shards))


def _stats(parts: Parts | None, kinesis: AsyncKinesis | None, byte_budget: ByteBudget, listener: TipListener | None,
           answer_s: float) -> dict[str, Any]:
    """:meth:`Planner.stats` from the run's parts."""
    k = kinesis
    tips, handout = (parts.tips, parts.handout) if parts is not None else (None, None)
    reported = tips.reported if tips is not None else None
    return {
        "probes": parts.latest.answers if parts is not None else 0,
        "lastAnswerMs": round(answer_s * 1000, 2),
        "backgroundProbes": tips.probes if tips else 0,
        "driverCalls": k.calls if k else 0,
        "driverRecordsFetched": k.records_fetched if k else 0,
        "budgetWaitS": round(k.waited_s, 3) if isinstance(k, PacedKinesis) else 0.0,
        "executorReadsBooked": handout.booked if handout else 0,
        # ranges whose every record the driver had read (probes, executors' reports) and
        # handed to the executor in the partition, and how many records they held
        "rangesCarried": handout.carried_ranges if handout else 0,
        "recordsCarried": handout.carried_records if handout else 0,
        "executorBytesRead": reported.read_bytes if reported else 0,
        "executorBytesExtra": reported.extra_bytes if reported else 0,
        # GetRecords the shards refused for throughput (each retried when its byte model
        # said): the driver's probes, and executor reads as reported
        "throttledProbes": byte_budget.throttles(),
        "throttledReads": reported.throttled if reported else 0,
        "tipReports": reported.applied if reported else 0,
        "tipReportsRefused": listener.refused if listener else 0,
        # booked reads whose report never came (executors that cannot reach tipReportHost)
        "tipReportsMissing": handout.missing if handout else 0,
        "watchedShards": tips.watched_count() if tips else 0,
        # the CPU seconds this planning process has used (every thread: Spark's, the loop's)
        "helperCpuS": round(time.process_time(), 3),
        **_feed_stats(parts.feeds if parts is not None else None),
        "shards": parts.latest.shard_lag() if parts is not None else {},
    }


def _feed_stats(feeds: Feeds | None) -> dict[str, int]:
    """The driver's own fan-out subscriptions (``efoSubscriptions=query``): shards held, calls
    that subscribed and that Kinesis refused, shards given up to executors, times a full run
    paused its subscription, what was received."""
    if feeds is None:
        return {}
    return {"heldShards": feeds.held(), "driverSubscriptions": feeds.subscriptions,
            "driverSubscriptionsRefused": feeds.refused, "heldGivenUp": feeds.given_up,
            "heldPauses": feeds.pauses,
            "driverEventsReceived": feeds.events, "driverRecordsReceived": feeds.records,
            "driverBytesReceived": feeds.bytes}


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
