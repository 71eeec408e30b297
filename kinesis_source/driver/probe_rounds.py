"""The background task that probes each tracked shard when it is due (``driver/tips.py`` says
when that is), on the planner's event loop.

Due times sit in a heap of ``(due, order, shard, view)`` rows; a row whose view was replaced or
rescheduled meanwhile is stale and skipped, so a round costs O(log shards) per shard probed,
not a scan of the table. What a probe finds is applied to the shard's view (``driver/tip_view.py``)
as the answer to its next batch.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import random
import time
from collections.abc import Callable

from botocore.exceptions import ClientError

from kinesis_source.aws.clients import error_code
from kinesis_source.aws.kinesis import THROTTLED
from kinesis_source.driver.budget import GET_RECORDS, CallBudget
from kinesis_source.driver.carried import run_cap
from kinesis_source.driver.probe import SETTLE_PAUSE_S, ProbeResult, TailProber
from kinesis_source.driver.shards import ShardStates
from kinesis_source.driver.tip_view import ShardTip
from kinesis_source.positions import AFTER, Position, ShardId, seq_key

log = logging.getLogger(__name__)

PROBE_CONCURRENCY = 64
THROTTLED_PAUSE_S = 5.0  # after a probe throttled beyond botocore's retries
IDLE_JITTER = 0.2  # an idle shard's interval is stretched by up to this fraction


class ProbeRounds:
    """Probes due shards within their call budgets; keeps the first error for ``latestOffset``."""

    def __init__(self, shards: ShardStates, prober: TailProber, budget: CallBudget, active_s: float,
                 idle_s: float, on_ended: Callable[[], None], carry: bool) -> None:
        self._shards = shards
        self._prober = prober
        self._budget = budget
        self.active_s = active_s
        self._idle_s = max(idle_s, active_s)
        self._on_ended = on_ended
        self._carry_runs = carry
        self.run_cap = run_cap(1)  # most bytes of one shard's carried run (set as shards are tracked)
        self.error: BaseException | None = None
        self.probes = 0
        self._wake: asyncio.Event | None = None
        self._changed: asyncio.Condition | None = None
        self._due: list[tuple[float, int, ShardId, ShardTip]] = []
        self._order = itertools.count()
        self._random = random.Random()

    # -- scheduling ----------------------------------------------------------------------

    def schedule(self, key: ShardId, view: ShardTip) -> None:
        """Probe ``key`` at its view's due time (unless it is being probed or cannot move)."""
        if view.probing or not view.live():
            return
        heapq.heappush(self._due, (view.due, next(self._order), key, view))
        if self._wake is not None:
            self._wake.set()

    def now_due(self, key: ShardId, view: ShardTip) -> None:
        """Look at ``key`` now rather than at its due time."""
        view.due = time.monotonic()
        self.schedule(key, view)

    def idle_again(self, view: ShardTip, now: float) -> None:
        """Nothing new on the shard: its next look backs off."""
        view.idle += 1
        interval = min(self._idle_s, self.active_s * 2 ** min(view.idle, 30))
        view.due = now + interval * (1 + IDLE_JITTER * self._random.random())

    def carry(self, view: ShardTip, after: str, records: list[dict], next_iterator: str | None,
              made: float | None = None) -> None:
        """Keep what a read found after record ``after`` for the range that starts there (not
        when ranges are read by fan-out)."""
        if self._carry_runs:
            view.carry(after, records, next_iterator, self.run_cap, made)

    # -- waiting for probes --------------------------------------------------------------

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def settled(self, keys: list[ShardId], timeout_s: float) -> None:
        """Wait until each of ``keys`` was probed since it was seeded (or the table failed)."""
        changed = self._condition()
        deadline = time.monotonic() + timeout_s

        def ready() -> bool:
            return self.error is not None or all(
                (v := self._shards.view(k)) is None or v.probed_at is not None for k in keys
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

    async def notify(self) -> None:
        """Wake whoever waits for a view's answer (a subscription's event answered it)."""
        changed = self._condition()
        async with changed:
            changed.notify_all()

    async def progress(self, timeout_s: float) -> None:
        """Wait for the next probe to finish (or ``timeout_s``)."""
        changed = self._condition()
        async with changed:
            try:
                await asyncio.wait_for(changed.wait(), timeout_s)
            except asyncio.TimeoutError:
                pass

    # -- the task ------------------------------------------------------------------------

    async def run(self) -> None:
        """Probe due shards until cancelled; a probe's error is kept for ``answers`` to raise."""
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

    def _next_wait(self, view: ShardTip, key: ShardId, now: float) -> float:
        """When ``key`` may be probed (``now`` if at once): not while its records wait for the
        read budget or an executor's report is due first, nor beyond its call budget."""
        wait = now + self.active_s if view.held else max(view.reading_until, view.watched_until)
        if wait > now:
            return wait
        return self._budget.free_at(key, GET_RECORDS, self._budget.reserve(GET_RECORDS, key), now)

    async def _rounds(self, gate: asyncio.Semaphore, tasks: set[asyncio.Task]) -> None:
        assert self._wake is not None
        while True:
            self._wake.clear()
            now = time.monotonic()
            while self._due and self._due[0][0] <= now and self.error is None:
                due, _, key, view = heapq.heappop(self._due)
                if self._shards.view(key) is not view or view.due != due or view.probing or not view.live():
                    continue  # replaced, rescheduled, being probed or at its end: a stale row
                wait = self._next_wait(view, key, now)
                if wait > now:
                    view.due = wait
                    heapq.heappush(self._due, (wait, next(self._order), key, view))
                    continue
                view.probing = True
                task = asyncio.ensure_future(self._probe(gate, key, view))
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

    async def _probe(self, gate: asyncio.Semaphore, key: ShardId, view: ShardTip) -> None:
        start = view.after()
        try:
            async with gate:
                start = view.after()  # (a report may have moved the view on meanwhile)
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
                view.due = time.monotonic() + THROTTLED_PAUSE_S
        except BaseException as exc:
            self._failed(exc)
            result = None
        finally:
            view.probing = False
        self.probes += 1
        with self._shards.lock:
            self.probed(key, view, start, result)
        await self.notify()

    def _failed(self, exc: BaseException) -> None:
        with self._shards.lock:
            self.error = exc  # surfaced by the next latestOffset

    def probed(self, key: ShardId, view: ShardTip, start: Position, result: ProbeResult | None) -> None:
        """Apply a probe's answer from ``start`` (None: it failed) to ``key``'s view (under the
        lock), and schedule its next probe."""
        if result is not None:
            before = view.state()
            if result.tip is not None and result.tip_at is not None:
                view.arrived(result.tip, result.tip_at)
            if result.counted is not None and result.tip is not None and start.kind == AFTER \
                    and start.sub_seq is None and start.seq is not None:
                view.counted(start.seq, result.tip, result.counted)
            if result.run and start.kind == AFTER and start.sub_seq is None and start.seq is not None:
                self.carry(view, start.seq, list(result.run), result.run_next)
            self._update(view, result)
            if view.state() != before:
                self._shards.changed.add(key)
        elif view.probed_at is None and self.error is None:
            view.probed_at = time.monotonic()  # a first answer is due: "nothing known yet"
        if self._shards.view(key) is view:
            self.schedule(key, view)

    def _update(self, view: ShardTip, result: ProbeResult) -> None:
        now = time.monotonic()
        view.probed_at = now
        view.behind_ms = result.behind_ms
        view.pending = result.pending
        if result.gone:
            view.gone = True
            self._on_ended()
        elif result.tip is not None:
            if view.tip is None or seq_key(result.tip) > seq_key(view.tip):
                view.tip = result.tip  # (an executor's report may have gone further meanwhile)
            view.idle = 0
            view.due = now + self.active_s
        elif result.ended:
            view.ended = True
            self._on_ended()
        elif result.pending:
            view.due = now + SETTLE_PAUSE_S
        else:
            self.idle_again(view, now)
