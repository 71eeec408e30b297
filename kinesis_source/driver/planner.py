"""Driver-side planning: initial and latest offsets, shard discovery, and the exact ranges of a
batch.

Where each shard's batch ends comes from the tip table (``driver/tips.py``), which the tail
probe (``driver/probe.py``) keeps fresh in the background within the per-shard call budget
(``driver/budget.py``): in steady state ``latestOffset`` makes no AWS call. The planner's event
loop runs in a thread of its own, so that the background work goes on between Spark's calls.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from kinesis_source.aws.clients import AwsSettings
from kinesis_source.aws.kinesis import AsyncKinesis, ShardInfo
from kinesis_source.driver.budget import GET_RECORDS, GET_SHARD_ITERATOR, CallBudget, PacedKinesis
from kinesis_source.driver.limits import BudgetPlanner
from kinesis_source.driver.probe import (
    SETTLE_PAUSE_S,
    SETTLE_TIMEOUT_S,
    ProbeResult,
    TailProber,
)
from kinesis_source.driver.start import resolve_positions
from kinesis_source.driver.tips import TipTable
from kinesis_source.errors import KinesisSourceError, report_shard_gone
from kinesis_source.lineage import gone_shards, probe_starts, retire_finished
from kinesis_source.option_values import InitialPosition
from kinesis_source.options import SourceOptions
from kinesis_source.positions import (
    AFTER,
    Offset,
    Position,
    ShardId,
    ShardRange,
    seq_key,
)

log = logging.getLogger(__name__)


T = TypeVar("T")

# How long the first answer for newly tracked shards waits for their first probe.
FIRST_PROBE_TIMEOUT_S = 60.0
# Under Trigger.AvailableNow, how long a batch waits for the table between looks.
_TARGET_WAIT_S = 0.5


@dataclass(frozen=True)
class Target:
    """What a ``Trigger.AvailableNow`` run reads: the data in the stream when it started.

    ``caps`` holds each shard open at that moment and its newest record then (None if it had
    none); shards closed then are read to their end. A shard created later holds only records
    that arrived after the start, so it is not read at all.
    """

    caps: dict[ShardId, str | None]
    closed: frozenset[ShardId]

    def bound(
        self, starts: dict[ShardId, Position]
    ) -> tuple[dict[ShardId, Position], dict[ShardId, str]]:
        """The shards of ``starts`` with records left within the target, and their caps."""
        kept: dict[ShardId, Position] = {}
        caps: dict[ShardId, str] = {}
        for sid, pos in starts.items():
            if sid in self.closed:
                kept[sid] = pos
                continue
            cap = self.caps.get(sid)
            if cap is None:
                continue
            if pos.kind == AFTER and _past(pos, cap):
                continue
            kept[sid], caps[sid] = pos, cap
        return kept, caps


def _past(pos: Position, cap: str) -> bool:
    """True when nothing up to ``cap`` is left after the ``AFTER`` position ``pos`` (inside an
    aggregate, the rest of the record ``cap`` itself may still be)."""
    assert pos.seq is not None
    if pos.sub_seq is not None:
        return seq_key(pos.seq) > seq_key(cap)
    return seq_key(pos.seq) >= seq_key(cap)


class Planner:
    """Plans offsets and ranges for one query run; lives in Spark's driver-side Python helper.

    Holds an event loop and an aiobotocore client made on first use (the reader that owns the
    planner must stay picklable until then), the shard listing, and the last probe's answer.
    """

    def __init__(self, opts: SourceOptions, kinesis: AsyncKinesis | None = None) -> None:
        """``kinesis``: a client to use instead of one made from the options (tests; its calls
        are paced by the budget only if it is a :class:`PacedKinesis`)."""
        self._opts = opts
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._kinesis: AsyncKinesis | None = kinesis
        self.budget = CallBudget({
            GET_RECORDS: opts.get_records_per_shard_per_second,
            GET_SHARD_ITERATOR: opts.get_shard_iterator_per_shard_per_second,
        })
        self._prober: TailProber | None = None
        self._tips: TipTable | None = None
        self._background: list[asyncio.Task] = []
        self._shards: dict[str, list[ShardInfo]] = {}
        self._listed_at = float("-inf")
        self._relist = False
        self._lag: dict[str, dict] = {}  # by "<stream>/<shardId>": Spark shows it as JSON
        self._identity: dict[str, str] | None = None
        self._target: Target | None = None
        self._turn = 0  # rotates which shard a limited batch serves first
        self._booked = 0
        self.probes = 0

    # -- runtime -------------------------------------------------------------------------

    def _run(self, coro: Awaitable[T]) -> T:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(
                target=self._loop.run_forever, name="kinesis-ddb-planner", daemon=True
            )
            self._thread.start()
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()  # type: ignore[arg-type]

    def kinesis(self) -> AsyncKinesis:
        """The run's Kinesis client, made now if it was not yet."""
        return self._run(self._client())

    async def _client(self) -> AsyncKinesis:
        if self._kinesis is None:
            settings = AwsSettings.for_kinesis(self._opts)
            self._kinesis = PacedKinesis(await settings.aio_client("kinesis"), self.budget)
        if self._prober is None:
            self._prober = TailProber(
                self._kinesis, self._opts.max_records_per_fetch, self._opts.fail_on_data_loss
            )
        return self._kinesis

    def _tip_table(self) -> TipTable:
        """The tip table, and the background tasks that keep it and the listing fresh."""
        if self._tips is None:
            opts = self._opts
            self._tips = TipTable(
                self._prober_ready(),
                self.budget,
                opts.min_probe_interval_ms / 1000,
                opts.max_idle_probe_interval_ms / 1000,
                on_ended=self._ended,
            )
            for work in (self._tips.run(), self._discover()):
                task = asyncio.ensure_future(work)
                task.add_done_callback(self._background_failed)
                self._background.append(task)
        return self._tips

    def _ended(self) -> None:
        self._relist = True  # a closed shard's children, or a gone shard's absence, come next

    def _background_failed(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None and self._tips is not None:
            self._tips.error = task.exception()

    async def _discover(self) -> None:
        """List the streams' shards every ``shardDiscoveryIntervalMs``, off the batch path."""
        interval = max(self._opts.shard_discovery_interval_ms / 1000, 1.0)
        while True:
            await asyncio.sleep(max(0.0, self._listed_at + interval - time.monotonic()))
            if time.monotonic() - self._listed_at >= interval:
                await self._listing(force=True)

    def close(self) -> None:
        """Stop the background work, close the client and the event loop."""
        if self._loop is None:
            return

        async def shutdown() -> None:
            for task in self._background:
                task.cancel()
            await asyncio.gather(*self._background, return_exceptions=True)
            if self._kinesis is not None:
                await self._kinesis.close()
                self._kinesis = None

        self._run(shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._loop.close()
        self._loop = None

    # -- shards --------------------------------------------------------------------------

    async def _listing(self, force: bool = False) -> dict[str, list[ShardInfo]]:
        due = time.monotonic() - self._listed_at >= self._opts.shard_discovery_interval_ms / 1000
        if force or due or not self._shards:
            k = await self._client()
            lists = await asyncio.gather(*(self._list(k, s) for s in self._opts.stream_names))
            self._shards = dict(zip(self._opts.stream_names, lists, strict=True))
            self._listed_at = time.monotonic()
        return self._shards

    async def _list(self, k: AsyncKinesis, stream: str) -> list[ShardInfo]:
        try:
            return await k.list_shards(stream)
        except KinesisSourceError:
            if self._opts.fail_on_data_loss:
                raise
            log.warning(
                "Kinesis stream '%s' was not found; reading none of it until it exists "
                "(failOnDataLoss=false)", stream
            )
            return []

    # -- offsets -------------------------------------------------------------------------

    def resolve_initial(
        self, spec: InitialPosition, streams: Collection[str] | None = None
    ) -> Offset:
        """Positions per listed shard for an initial position (LATEST probes each tip); with
        ``streams``, for the shards of those streams only."""
        return self._run(self._resolve_initial(spec, streams))

    async def _resolve_initial(
        self, spec: InitialPosition, streams: Collection[str] | None
    ) -> Offset:
        listing = await self._listing(force=True)
        return await resolve_positions(spec, listing, self._prober_ready(), streams)

    def shard_ids(self) -> set[ShardId]:
        """Every listed shard (lists now if not yet listed)."""
        listing = self._run(self._listing())
        return {ShardId(st, s.shard_id) for st, shards in listing.items() for s in shards}

    def hash_ranges(self) -> dict[ShardId, tuple[int, int] | None]:
        """Each listed shard's (first, last) hash key (lists now if not yet listed); None where
        the listing gave no range."""
        listing = self._run(self._listing())
        return {
            ShardId(st, s.shard_id): s.hash_range
            for st, shards in listing.items()
            for s in shards
        }

    def streams_entering(self, start: Offset) -> list[str]:
        """The query's streams that have shards (listing now if none was made yet) but none
        in ``start``: streams added to a query that already ran. Asked on every
        ``latestOffset``, so the last listing serves (the probe refreshes it)."""
        listing = self._shards or self._run(self._listing())
        return [s for s in self._opts.stream_names if listing.get(s) and s not in start.streams]

    def listed(self) -> Mapping[str, list[ShardInfo]]:
        """The shard listing as last fetched (no call; empty before the first listing)."""
        return self._shards

    def stream_identities(self) -> dict[str, str]:
        """Each stream's creation time: a stream re-created under its name gets a new one.
        Asked once per run (the checkpointer compares and stores it)."""
        if self._identity is None:
            self._identity = self._run(self._identities())
        return self._identity

    async def _identities(self) -> dict[str, str]:
        k = await self._client()
        streams = self._opts.stream_names
        created = await asyncio.gather(*(k.creation_time(s) for s in streams))
        return dict(zip(streams, created, strict=True))

    def _prober_ready(self) -> TailProber:
        assert self._prober is not None, "client not created"
        return self._prober

    def latest_offset(self, start: Offset, max_records: int | None = None) -> Offset:
        """The exact end of the next batch: every shard's newest known record after ``start``
        (from the tip table: no AWS call in steady state), or, with ``max_records``, a fair cut
        holding at most that many user records (``driver/limits.py``, which reads on the
        driver). Under ``Trigger.AvailableNow`` no shard goes past its target.

        Returns ``start`` itself when nothing new is known, so idle streams run no batches.
        """
        return self._run(self._probe(start, max_records))

    def prepare_available_now(self) -> Target:
        """Fix the target of a ``Trigger.AvailableNow`` run: every open shard's newest record
        now. Later ends never pass it, so the run stops once every shard reached it."""
        self._target = self._run(self._find_target())
        log.info(
            "Trigger.AvailableNow: reading up to the newest record of %d open shard(s), and "
            "%d closed shard(s) to their end",
            len(self._target.caps), len(self._target.closed),
        )
        return self._target

    async def _find_target(self) -> Target:
        listing = await self._listing(force=True)
        open_shards = {
            ShardId(stream, s.shard_id): Position.trim_horizon()
            for stream, shards in listing.items()
            for s in shards
            if not s.is_closed
        }
        results = await self._prober_ready().settle_all(open_shards)
        unsettled = sorted(str(sid) for sid, r in results.items() if r.pending)
        if unsettled:
            raise KinesisSourceError(
                f"Trigger.AvailableNow cannot fix its target: Kinesis served only empty pages "
                f"for shard(s) {', '.join(unsettled)} for {SETTLE_TIMEOUT_S:g} s, so their newest "
                "record is unknown. Start the query again (the next probe goes on from there)."
            )
        closed = frozenset(
            ShardId(stream, s.shard_id)
            for stream, shards in listing.items()
            for s in shards
            if s.is_closed
        )
        return Target({sid: r.tip for sid, r in results.items()}, closed)

    async def _probe(self, start: Offset, max_records: int | None) -> Offset:
        listing = await self._listing(force=self._relist)
        self._relist = False
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
        self.probes += 1
        lag = {}
        for sid, result in results.items():
            lag[str(sid)] = {"tip": result.tip, "millisBehindLatest": result.behind_ms}
            if result.gone:
                positions.pop(sid, None)  # reported by the probe; the listing will drop it
                self._relist = True
            elif result.tip is not None:
                positions[sid] = Position.after(result.tip)
            elif result.ended:
                positions[sid] = Position.shard_end()
                self._relist = True  # its children are what comes next
            elif sid not in positions:
                # A newly eligible shard joins the offset at once, even empty, so that its
                # parents can leave it.
                positions[sid] = starts[sid]
        self._lag = lag
        return Offset(retire_finished(listing, positions, start.shards))

    async def _ends(
        self,
        starts: dict[ShardId, Position],
        caps: dict[ShardId, str],
        max_records: int | None,
    ) -> dict[ShardId, ProbeResult]:
        """Each shard's end for the next batch: its tip, or a fair cut under a read limit."""
        await self._client()
        tips = self._tip_table()
        if max_records is not None:
            tips.track({})  # a limited batch reads its records itself
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

    def hand_over(self, ranges: list[ShardRange]) -> dict[ShardId, tuple[tuple[str, str] | None, float]]:
        """For each range an executor will read: the iterator the probe left at its start (if
        fresh) and the wall-clock time before which the read must not start, its calls booked
        in the shard's budget (so driver probes and executor reads of a shard never exceed it
        together)."""
        return self._run(self._hand_over(ranges))

    async def _hand_over(
        self, ranges: list[ShardRange]
    ) -> dict[ShardId, tuple[tuple[str, str] | None, float]]:
        if self._opts.consumer_mode == "efo":
            return {}  # subscriptions do not spend the polling budget
        await self._client()
        out: dict[ShardId, tuple[tuple[str, str] | None, float]] = {}
        now, wall = time.monotonic(), time.time()
        for rng in ranges:
            opener = self._prober_ready().opener(rng.shard, rng.start)
            at = self.budget.free_at(rng.shard, GET_RECORDS, now=now)
            if opener is None:
                at = max(at, self.budget.free_at(rng.shard, GET_SHARD_ITERATOR, now=now))
                self.budget.spend(rng.shard, GET_SHARD_ITERATOR, now=at)
            self.budget.spend(rng.shard, GET_RECORDS, now=at)
            self._booked += 1
            out[rng.shard] = (opener, wall + (at - now))
        return out

    def stats(self) -> dict[str, Any]:
        """Driver-side cost so far (``latestOffset`` answers, background probes, AWS calls,
        records fetched, seconds calls waited for the budget, executor reads booked) and, per
        shard of the last answer, the tip and how far behind it the batch started."""
        k = self._kinesis
        return {
            "probes": self.probes,
            "backgroundProbes": self._tips.probes if self._tips else 0,
            "driverCalls": k.calls if k else 0,
            "driverRecordsFetched": k.records_fetched if k else 0,
            "budgetWaitS": round(k.waited_s, 3) if isinstance(k, PacedKinesis) else 0.0,
            "executorReadsBooked": self._booked,
            "shards": self._lag,
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
