"""The source's per-shard call budget, driver and executors together.

Kinesis gives each shard 5 ``GetRecords`` and 5 ``GetShardIterator`` calls a second, shared by
every application that reads it. This source keeps to a smaller budget (by default 2 and 1) so
that the rest stays free for the others. The driver keeps the ledger: its own calls are paced by
it as they are made (:class:`PacedKinesis`), and each executor read is charged when its batch is
planned (the executor paces its further pages itself, see ``executor/polling.py``).

A budget of ``r`` calls a second is kept as "at most ``n`` calls in any ``n / r`` seconds"
(``n`` = ``ceil(r)``, at least 2 from 1 a second, plus ``ARRIVAL_MARGIN_S`` for the way to the
server), so a window of ``W`` seconds holds at most ``n`` calls per started ``n / r`` seconds:
for whole rates, any 10 s hold at most ``10 r``, which is how the acceptance figures count, and
any second at most ``max(2, r)`` of Kinesis' 5.

Bytes have their budget too (:class:`ByteBudget`, one ``read_rate.ShardBytes`` model per shard):
the driver's probes spend from it and fit their ``Limit`` to it, each executor read starts
from the model's state handed over with its range, and the state the read ended with (in its
tip report) replaces the driver's.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import time
from collections import defaultdict
from collections.abc import Hashable, Mapping

from botocore.exceptions import ClientError
from tenacity import AsyncRetrying

from kinesis_source.aws.kinesis import ARRIVAL_MARGIN_S, AsyncKinesis, Page, is_throttled, throttle_retry
from kinesis_source.driver.shards import ShardStates
from kinesis_source.positions import Position
from kinesis_source.read_rate import RateState, ShardBytes, page_bytes

GET_RECORDS = "GetRecords"
GET_SHARD_ITERATOR = "GetShardIterator"
MAX_LIMIT = 10_000  # GetRecords' largest Limit
# A probe waits until its shard's byte model holds what it asks for, up to this many seconds of
# refill (a probe reads a few records near the tip; this only matters on a drained shard).
PROBE_WANT_S = 1.0
# A call that ``PacedKinesis.ready`` spent ahead is made at once; if it was not (the probe
# failed first), the next call after this long paces again.
BOOKED_TTL_S = 1.0
# A budget of 1 call a second or more holds at least two calls a window: 1 a second is "2 in
# any 2 seconds", so that a first look at a shard (its start's iterator, then one at the
# estimated tip) costs no second of waiting, and any second holds at most 2 of the 5 Kinesis
# allows. (Below 1 a second a window keeps one call: two would let a 10 s window hold more than
# the rate.)
MIN_BURST = 2


class _Window:
    """At most ``n`` events in any ``span`` seconds."""

    def __init__(self, rate: float) -> None:
        self.n = max(MIN_BURST if rate >= 1 else 1, math.ceil(rate))
        self.span = self.n / rate + ARRIVAL_MARGIN_S
        self.times: list[float] = []  # sorted; an executor read may be booked ahead of now

    def _trim(self, now: float) -> None:
        cut = bisect.bisect_right(self.times, now - self.span)
        if cut:
            del self.times[:cut]

    def room(self, now: float) -> int:
        self._trim(now)
        return self.n - len(self.times)

    def free_at(self, now: float, keep: int) -> float:
        """When ``keep + 1`` events fit (``now`` if they do already); ``keep`` < ``n``. Events
        booked ahead count from their time on."""
        self._trim(now)
        at = now
        while True:
            inside = [t for t in self.times if at - self.span < t <= at + self.span]
            # the window ending at or after ``at`` with the most events decides
            over = len(inside) + keep + 1 - self.n
            if over <= 0:
                return at
            # (strictly later: in floats (t + span) - span can come out below t, and the same
            # event would stay inside for ever)
            at = max(inside[over - 1] + self.span, math.nextafter(at, math.inf))


class CallBudget:
    """Calls per second per shard for each operation, and the rules for spending and booking
    them; each shard's windows live in its record (``driver/shards.py``). :meth:`reserve` says
    how many of each window the driver's own calls leave free."""

    def __init__(self, rates: dict[str, float], shards: ShardStates | None = None) -> None:
        """``shards``: the query run's shard records (a registry of its own if None)."""
        self.rates = dict(rates)
        self.shards = shards if shards is not None else ShardStates()
        self.spent: dict[str, int] = defaultdict(int)
        # Planning state's one lock: the shards' records'. The planner's loop thread changes
        # them; latestOffset reads them from Spark's thread.
        self.lock = self.shards.lock

    def _window(self, key: Hashable, op: str) -> _Window:
        windows = self.shards.state(key).windows
        w = windows.get(op)
        if w is None:
            w = windows[op] = _Window(self.rates[op])
        return w

    def reserve(self, op: str, key: Hashable | None = None) -> int:
        """Calls of a window kept for executor reads: half, so probes and reads alternate;
        none on a shard whose last range the driver carried whole (driver/carried.py:
        executors read none of it), nor on a shard no read was booked on yet: its first looks
        (an AvailableNow target, LATEST, the first answer) are what a read waits for, and a
        read booked after them still fits the same windows."""
        if key is not None:
            state = self.shards.get(key)
            if state is None or state.carried_whole or not state.read_booked:
                return 0
        # half of a second's calls (none of a budget of 1 a second: its two-call window is
        # only a burst, driver and executors share it as they come)
        return max(1, math.ceil(self.rates[op])) // 2

    def _window_size(self, op: str) -> int:
        return max(MIN_BURST, math.ceil(self.rates[op]))

    def _found(self, key: Hashable, op: str) -> _Window | None:
        state = self.shards.get(key)
        return None if state is None else state.windows.get(op)

    def room(self, key: Hashable, op: str, now: float | None = None) -> int:
        """Calls of ``op`` on shard ``key`` that fit now."""
        with self.lock:
            window = self._found(key, op)
            return self._window_size(op) if window is None else window.room(time.monotonic() if now is None else now)

    def free_at(self, key: Hashable, op: str, keep: int = 0, now: float | None = None) -> float:
        """When a call of ``op`` fits on ``key`` while leaving ``keep`` calls of the window
        (reads the shard's record only: Spark's thread asks too)."""
        at = time.monotonic() if now is None else now
        with self.lock:
            window = self._found(key, op)
            return at if window is None else window.free_at(at, keep)

    def spend(self, key: Hashable, op: str, n: int = 1, now: float | None = None) -> None:
        """Record ``n`` calls (made now, or about to be)."""
        with self.lock:
            at = time.monotonic() if now is None else now
            window = self._window(key, op)
            for _ in range(n):
                bisect.insort(window.times, at)
            self.spent[op] += n

    def book_read(self, key: Hashable, needs_iterator: bool, now: float) -> tuple[float, dict[str, list[float]]]:
        """Book an executor read's first calls on ``key`` (a ``GetShardIterator`` too when it
        has no iterator handed over) at the first time they fit; returns that time and the
        bookings by operation (for :meth:`settle`)."""
        with self.lock:
            self.shards.state(key).read_booked = True
            ops = [GET_RECORDS, GET_SHARD_ITERATOR] if needs_iterator else [GET_RECORDS]
            at = max(self.free_at(key, op, now=now) for op in ops)
            for op in ops:
                self.spend(key, op, now=at)
            return at, {op: [at] for op in ops}

    def settle(self, key: Hashable, op: str, booked: list[float], actual: list[float], made: int | None = None) -> None:
        """Replace an executor read's booked calls of ``op`` on ``key`` with the times it
        actually called (monotonic): a task that started late must not let the next booking
        come closer than the budget allows, and pages after the first were never booked.
        ``made``: how many calls the read made in all, when ``actual`` holds the newest only."""
        with self.lock:
            window = self._window(key, op)
            for at in booked:
                i = bisect.bisect_left(window.times, at)
                if i < len(window.times) and window.times[i] == at:
                    del window.times[i]
            for at in actual:
                bisect.insort(window.times, at)
            self.spent[op] += max(len(actual), made or 0) - len(booked)



class ByteBudget:
    """The rules of every shard's byte model on the driver (each model lives in its shard's
    record, changed under the planning lock; times: wall clock)."""

    def __init__(self, cap: float | None, shards: ShardStates) -> None:
        self.cap = cap
        self.shards = shards
        self.lock = shards.lock
        self._forgotten_throttles = 0

    def model(self, key: Hashable) -> ShardBytes:
        """``key``'s model (a full bucket the first time)."""
        with self.lock:
            state = self.shards.state(key)
            if state.bytes is None:
                state.bytes = ShardBytes(self.cap, None, time.time())
            return state.bytes

    def _found(self, key: Hashable) -> ShardBytes | None:
        state = self.shards.get(key)
        return None if state is None else state.bytes

    def hand_out(self, key: Hashable, records: int | None) -> RateState:
        """The state an executor read of ``key`` starts from; the read's bytes (``records``
        records, when known, at the shard's size) are booked here until its report."""
        with self.lock:
            model, now = self.model(key), time.time()
            state = model.state(now)
            if records and model.record_bytes:
                model.spend(int(records * model.record_bytes), 0, now)
            return state

    def wait_s(self, key: Hashable, interval_s: float) -> float:
        """How long until ``key``'s model holds a page's worth for a read paced at
        ``interval_s`` (0 for a shard without a model: its bucket is taken as full)."""
        with self.lock:
            model = self._found(key)
            if model is None:
                return 0.0
            return model.wait_s(model.want_bytes(MAX_LIMIT, interval_s), time.time())

    def adopt(self, key: Hashable, state: RateState) -> None:
        """A read's last state becomes the shard's model (it saw every byte the read took)."""
        with self.lock:
            old = self._found(key)
            if old is not None:
                now = time.time()
                # (a state from a clock ahead is taken as of now)
                new = self.shards.state(key).bytes = ShardBytes(self.cap, state, now)
                new.throttles = old.throttles  # the driver's own, counted in stats

    def charge(self, key: Hashable, nbytes: int) -> None:
        """Bytes a read took that the shard's model did not hand out (a read Spark ran
        again): spent from the model as of now."""
        with self.lock:
            model = self._found(key)
            if model is not None:
                model.spend(nbytes, 0, time.time())

    def forget(self, key: Hashable) -> None:
        """Count a shard's throttles before its record goes (it left the query)."""
        with self.lock:
            gone = self._found(key)
            if gone is not None:
                self._forgotten_throttles += gone.throttles
                self.shards.state(key).bytes = None

    def throttles(self) -> int:
        """The driver's calls refused for throughput, over every shard's model so far."""
        with self.lock:
            return self._forgotten_throttles + sum(s.bytes.throttles for s in self.shards if s.bytes is not None)


class PacedKinesis(AsyncKinesis):
    """The driver's Kinesis calls, each waiting for its shard's budgets (calls and bytes) and
    leaving the executor reserve free. Every call names its shard: there is no call on an
    iterator alone, so none can miss its shard's budget (an iterator -> shard ledger once
    forgot the iterators of a long probe over empty pages, and their calls went unpaced)."""

    def __init__(
        self, client, budget: CallBudget, byte_budget: ByteBudget | None = None, attempts: int = 11,
        arns: Mapping[str, str] | None = None,
    ) -> None:
        """``byte_budget``: the rules of the shards' byte models (None: without a cap, on the
        budget's shard records);
        ``attempts``: most tries of a throttled ``GetRecords`` (``maxRetries`` + 1); ``arns``:
        the streams given by ARN."""
        super().__init__(client, arns)
        self.budget = budget
        self.byte_budget = byte_budget if byte_budget is not None else ByteBudget(None, budget.shards)
        self._attempts = attempts
        self.waited_s = 0.0

    async def _pace(self, key: Hashable, op: str) -> None:
        booked = self.budget.shards.state(key).spent_ahead.pop(op, None)
        now = time.monotonic()
        if booked is not None and now - booked < BOOKED_TTL_S:
            # :meth:`ready` waited for this call and spent it: now is when it is made
            self.budget.settle(key, op, [booked], [now])
            return
        while True:  # several probes of one shard may wait for the same window
            now = time.monotonic()
            # (asked each time: a read booked while this call waited takes its share back)
            at = self.budget.free_at(key, op, self.budget.reserve(op, key), now)
            if at <= now:
                self.budget.spend(key, op, 1, now)
                return
            self.waited_s += at - now
            await asyncio.sleep(at - now)  # pacing to the budget, not waiting on a condition

    async def iterator(self, stream: str, shard_id: str, position: Position) -> str:
        key = (stream, shard_id)
        await self._pace(key, GET_SHARD_ITERATOR)
        return await super().iterator(stream, shard_id, position)

    def _bytes_wait(self, key: Hashable, limit: int) -> float:
        """Seconds until the shard's byte model holds what ``limit`` records are worth (up to
        ``PROBE_WANT_S`` of refill)."""
        with self.byte_budget.lock:
            model = self.byte_budget.model(key)
            return model.wait_s(model.want_bytes(limit, PROBE_WANT_S), time.time())

    async def ready(self, key: Hashable, ops: tuple[str, ...]) -> None:
        """Wait until one call of each of ``ops`` on shard ``key`` fits its budget (leaving the
        executor reserve) and a page's bytes are there, and spend those calls now: the calls
        that follow at once do not wait again. A probe that estimates where a shard's tip is
        calls this first, so that no wait lies between its estimate and its read (records that
        arrive during a wait are read too, from the shard's shared bytes)."""
        while True:
            now = time.monotonic()
            with self.budget.lock:
                at = max(self.budget.free_at(key, op, self.budget.reserve(op, key), now) for op in ops)
                wait = max(at - now, self._bytes_wait(key, MAX_LIMIT))
                if wait <= 0:
                    ahead = self.budget.shards.state(key).spent_ahead
                    for op in ops:
                        self.budget.spend(key, op, 1, now)
                        ahead[op] = now
                    return
            self.waited_s += wait
            await asyncio.sleep(wait)  # pacing to the budget, not waiting on a condition

    async def _pace_bytes(self, key: Hashable, limit: int) -> int:
        """Wait until the shard's byte model holds what ``limit`` records are worth (up to
        ``PROBE_WANT_S`` of refill) and return the ``Limit`` that fits it."""
        model = self.byte_budget.model(key)
        wait = self._bytes_wait(key, limit)
        if wait > 0:
            self.waited_s += wait
            await asyncio.sleep(wait)  # pacing to the budget, not waiting on a condition
        with self.byte_budget.lock:
            return model.limit(limit, time.time())

    async def page(self, stream: str, shard_id: str, iterator: str, limit: int) -> Page:
        key = (stream, shard_id)
        async for attempt in AsyncRetrying(**throttle_retry(self._attempts)):
            with attempt:
                await self._pace(key, GET_RECORDS)
                fitted = await self._pace_bytes(key, limit)
                try:
                    page = await super().page(stream, shard_id, iterator, fitted)
                    page.asked = fitted
                except ClientError as exc:
                    if is_throttled(exc):
                        with self.byte_budget.lock:
                            self.byte_budget.model(key).refused(time.time())
                    raise
        with self.byte_budget.lock:
            self.byte_budget.model(key).spend(page_bytes(page.records), len(page.records), time.time())
        return page

    def forget(self, key: Hashable) -> None:
        """Count what a shard that left the query leaves in the totals (its record is dropped
        by ``TailProber.forget``)."""
        self.byte_budget.forget(key)
