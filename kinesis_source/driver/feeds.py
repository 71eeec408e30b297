"""Fan-out with the driver holding each shard's subscription for the query's life
(``efoSubscriptions=query``).

Kinesis allows one subscription of a consumer and shard per 5 s, and each lasts up to 5 minutes.
A subscription per batch's range (``efoSubscriptions=range``) therefore gave a shard a batch
every 5 s, and Spark's Python data source API cannot send a shard's next range to the worker
that holds its subscription (no preferred locations). So the driver's helper holds them: one
subscription per shard, opened at the batch's start and renewed after its last record when
Kinesis ends it, and what it receives is the shard's carried run (``driver/carried.py``). The
next range's records go to its task inside the partition, as the polling path's carried ranges
do: the executor makes no call, each record crosses the network from Kinesis once, and a batch
can follow a record within milliseconds of its arrival.

Exactness: a run holds what one subscription (or a chain of them, each opened at the last
record received and checked to send that record first) returned after the range's start, in
order: exactly the records a read of the range returns. A task retried by Spark gets the same
partition; a batch replayed after a restart is not held (the new run's driver never received
it) and is read by its executor's own subscription (``executor/fanout.py``), after which the
driver subscribes again from its end, 5 s after the executor did.

A subscription that cannot go on (its consumer or shard gone, a gap found by the opening check,
failures before any event ``FEED_FAILURES`` times in a row) is given up: the shard's probes and
executor subscriptions take over, and they report the cause as the range readers do. A run that
holds ``run_cap`` bytes not yet handed out pauses its subscription until a batch takes them
(a backlog: Kinesis pushes up to 2 MiB/s a shard, more than one Python process takes for many
shards).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError
from tenacity import AsyncRetrying, retry_if_exception, wait_exponential

from kinesis_source.aws.clients import AwsSettings, error_code
from kinesis_source.aws.kinesis import IN_USE
from kinesis_source.aws.subscribe import (
    CALL_GAP_S,
    DRIVER_GAP_S,
    Attempts,
    event_ended,
    recoverable,
    refused_by_rule,
    starting_position,
    subscription_wait,
)
from kinesis_source.driver.carried import CarriedRun
from kinesis_source.driver.probe_rounds import ProbeRounds
from kinesis_source.driver.shards import ShardState, ShardStates
from kinesis_source.driver.tip_view import ShardTip
from kinesis_source.errors import SubscriptionEndedEarly
from kinesis_source.positions import AFTER, AT_TIMESTAMP, TRIM_HORIZON, Position, ShardId, seq_key
from kinesis_source.read_rate import page_bytes

log = logging.getLogger(__name__)

# Bytes one shard's run may hold before its subscription pauses, and about that many over all
# the shards held (the helper's memory; a range's records also travel in its task). A record
# counts its data and key and RECORD_OVERHEAD for what holding it costs besides (its dict, a
# 56-digit sequence number, its time; pickled into the task about half that), so a run of tiny
# records is bounded too.
RUN_MAX_BYTES = 4 << 20
RUNS_MAX_BYTES = 256 << 20
RECORD_OVERHEAD = 200
# Shards held at most: each holds a connection of the client's pool (4,096); a shard past it is
# read as with efoSubscriptions=range (its executors' own subscriptions), not left waiting.
MAX_HELD_SHARDS = 4000
# Failures before a subscription's first event, in a row, before the shard is left to the
# probes and executor subscriptions (a failure after events renews the subscription as soon as
# Kinesis' 5 s rule allows; the next range handed to an executor starts one again). Refusals
# under the per-shard rules count apart (``aws/subscribe.py``'s ``Attempts``).
FEED_FAILURES = 8
# While an executor's own subscription reads the shard, the driver looks this often whether
# its report came.
READ_POLL_S = 0.2


class _FeedOver(Exception):
    """The feed has nothing more to do: its shard ended, or its view or run was replaced."""


class FeedGap(Exception):
    """A renewed subscription did not send the record it was opened at first: records were
    trimmed meanwhile. The shard's executor reads check and report the loss."""


def holdable(start: Position) -> bool:
    """True when a subscription opened at ``start`` returns exactly a range's records from it."""
    return (start.kind == AFTER and start.sub_seq is None) or start.kind in (TRIM_HORIZON, AT_TIMESTAMP)


def held_bytes(run: CarriedRun) -> int:
    """What a run costs to hold, for the run cap (see :data:`RECORD_OVERHEAD`)."""
    return run.size + RECORD_OVERHEAD * len(run.records)


def new_run(start: Position) -> CarriedRun:
    """The empty run of records a subscription opened at ``start`` will receive."""
    if start.kind == AFTER:
        assert start.seq is not None
        return CarriedRun(start.seq, [], None)
    return CarriedRun("", [], None, origin=start.to_str())


@dataclass(eq=False)
class Feed:
    """The driver's subscription of one shard, feeding one view's carried run."""

    view: ShardTip
    origin: Position  # where the first subscription opened
    last: str = ""  # the last record appended to the run ("": none yet)
    task: asyncio.Task | None = None
    paused: bool = False  # the run is full: waiting for a batch to take records
    resume: asyncio.Event = field(default_factory=asyncio.Event)


class Feeds:
    """The driver's subscriptions, one per held shard (in the shard's record), on the loop."""

    def __init__(self, shards: ShardStates, rounds: ProbeRounds, settings: AwsSettings, subscribe_timeout_s: float,
                 on_ended: Callable[[], None]) -> None:
        self._shards = shards
        self._rounds = rounds
        # (no botocore retries: its re-sends broke the 1 call/s rule and took the first over)
        self._settings = dataclasses.replace(settings.silent_for_at_most(subscribe_timeout_s), max_retries=0)
        self._on_ended = on_ended
        self.arns: dict[str, str] = {}  # consumer ARN by stream
        self._client: Any = None
        self._tasks: set[asyncio.Task] = set()
        self._live = 0  # shards held (the per-shard run cap divides the helper's memory among them)
        self.off = False  # Trigger.AvailableNow: a backlog to a target, read by executors
        self.subscriptions = self.refused = self.given_up = self.pauses = 0
        self.events = self.records = self.bytes = 0

    def use(self, arns: Mapping[str, str]) -> None:
        """The consumers are known: hold every tracked shard that is not yet (loop)."""
        self.arns = dict(arns)
        if self.off:
            return
        with self._shards.lock:
            for state in self._shards:
                if state.feed is None and state.view is not None and state.view.live():
                    self.seeded(state.key, state.view)

    def seeded(self, key: ShardId, view: ShardTip) -> None:
        """``key``'s view was (re)seeded: hold it from its seed (loop, lock held)."""
        state = self._shards.state(key)
        self._stop(state)
        if holdable(view.seed) and self._holds(key):
            self._start(state, view, view.seed)

    def handed(self, key: ShardId, end_seq: str) -> None:
        """``key``'s range up to ``end_seq`` went to an executor's own subscription: hold the
        shard from there once that read reported and 5 s passed (loop)."""
        with self._shards.lock:
            state = self._shards.state(key)
            self._stop(state)
            view = state.view
            if view is not None and view.live() and self._holds(key):
                self._start(state, view, Position.after(end_seq))

    def taken(self, key: ShardId) -> None:
        """A batch took records of ``key``'s run: a paused subscription resumes once the run
        is half empty (loop)."""
        state = self._shards.get(key)
        feed = state.feed if state is not None else None
        run = feed.view.run if feed is not None else None
        if feed is not None and feed.paused and (run is None or held_bytes(run) <= self.run_cap() // 2):
            feed.paused = False
            feed.resume.set()

    def dropped(self, key: ShardId) -> None:
        """``key`` left the table (or its view did): its subscription ends (loop, lock held)."""
        state = self._shards.get(key)
        if state is not None:
            self._stop(state)

    def stop_all(self) -> None:
        """Hold no shard from now on (``Trigger.AvailableNow``: the run reads a backlog up to a
        target, which executors read in parallel; a held run would wait for its subscription)."""
        with self._shards.lock:
            self.off = True
            for state in self._shards:
                self._stop(state)

    def held(self) -> int:
        """How many shards the driver holds a subscription of."""
        return self._live

    def _holds(self, key: ShardId) -> bool:
        return key.stream in self.arns and not self.off and self._live < MAX_HELD_SHARDS

    def run_cap(self) -> int:
        """Most bytes one held shard's run takes before its subscription pauses."""
        return min(RUN_MAX_BYTES, RUNS_MAX_BYTES // max(1, self._live))

    def _start(self, state: ShardState, view: ShardTip, origin: Position) -> None:
        view.run = new_run(origin)
        view.watched_until = math.inf  # the subscription brings its tips: no probe
        feed = state.feed = Feed(view, origin, last=view.run.last)
        self._live += 1
        feed.task = asyncio.ensure_future(self._feed(state, feed))
        self._tasks.add(feed.task)
        feed.task.add_done_callback(self._tasks.discard)

    def _stop(self, state: ShardState) -> None:
        feed, state.feed = state.feed, None
        if feed is None:
            return
        self._live -= 1
        if feed.task is not None:
            feed.task.cancel()
        self._probed_again(state, feed)

    def _probed_again(self, state: ShardState, feed: Feed) -> None:
        view = feed.view
        view.held = False  # (a wait for the 5 s rule no longer applies: probes find the tips)
        if view.watched_until == math.inf:
            view.watched_until = 0.0
            if state.view is view and view.live():
                self._rounds.now_due(state.key, view)

    async def close(self) -> None:
        """End every subscription and close the client."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.__aexit__(None, None, None)
            self._client = None

    async def _feed(self, state: ShardState, feed: Feed) -> None:
        try:
            while state.feed is feed:
                async for attempt in AsyncRetrying(
                    retry=retry_if_exception(recoverable), stop=Attempts(FEED_FAILURES),
                    wait=subscription_wait(wait_exponential(multiplier=0.5, max=5.0)), reraise=True,
                ):
                    with attempt:
                        await self._ready(state, feed)
                        await self._follow(state, feed)
        except asyncio.CancelledError:
            raise
        except _FeedOver:
            pass
        except Exception as exc:  # noqa: BLE001 - the executors' reads report it as theirs do
            self.given_up += 1
            log.warning("the driver's fan-out subscription of %s stopped (%s): executors read its ranges "
                        "with their own subscriptions", state.key, exc)
        finally:
            with self._shards.lock:
                if state.feed is feed:
                    feed.task = None  # (ending now: not cancelled)
                    self._stop(state)

    async def _ready(self, state: ShardState, feed: Feed) -> None:
        """Wait until the shard's next subscription may open: its run has room, no executor's
        own read of it is unreported, and Kinesis' 5 s and 1 s rules allow it."""
        while True:
            if feed.paused:
                await feed.resume.wait()
            wait = max(state.subscribed_at + DRIVER_GAP_S - time.time(),
                       state.called_at + CALL_GAP_S - time.monotonic())
            if state.key in self._shards.unreported:
                wait = max(wait, READ_POLL_S)
            if wait <= 0:
                return
            await asyncio.sleep(wait)

    async def _follow(self, state: ShardState, feed: Feed) -> None:
        """One subscription, until Kinesis ends it or the feed pauses or ends."""
        key = state.key
        client = await self._aio()
        position = Position.at(feed.last) if feed.last else feed.origin
        state.called_at = time.monotonic()
        try:
            resp = await client.subscribe_to_shard(
                ConsumerARN=self.arns[key.stream], ShardId=key.shard, StartingPosition=starting_position(position))
        except ClientError as exc:
            if refused_by_rule(exc):
                self.refused += 1
            raise
        state.subscribed_at = max(state.subscribed_at, time.time())
        self.subscriptions += 1
        stream, events = resp["EventStream"], 0
        check = feed.last or None  # opened at the last record received: it comes first again
        try:
            async for message in stream:
                event = message.get("SubscribeToShardEvent")
                if event is None:
                    continue
                events += 1
                try:
                    check, going = self._apply(state, feed, event, check)
                finally:
                    await self._rounds.notify()  # (a first answer may wait for this event)
                if not going:
                    return
                if feed.paused:  # the run is full: stop reading, the subscription kept (see _apply)
                    await feed.resume.wait()
        except _FeedOver:
            raise
        except Exception as exc:
            if isinstance(exc, ClientError) and error_code(exc) == IN_USE:
                log.warning("the driver's subscription of %s through EFO consumer %s was taken over by another "
                            "SubscribeToShard: another query or application reads through the same consumer (give "
                            "each its own 'consumerName'); subscribing again in 5 s", key, self.arns[key.stream])
            if events and recoverable(exc):
                log.info("the driver's subscription of %s broke (%s); renewing it", key, exc)
                return
            raise
        finally:
            stream.close()
        if not events:
            raise SubscriptionEndedEarly(f"a subscription of {key} ended without an event")

    def _apply(self, state: ShardState, feed: Feed, event: dict, check: str | None) -> tuple[str | None, bool]:
        """One event into the run and the view; returns the check still due and whether the
        subscription goes on (False: it pauses; :class:`_FeedOver`: the feed ends)."""
        records = event.get("Records") or []
        self.events += 1
        with self._shards.lock:
            view, run = feed.view, feed.view.run
            if state.feed is not feed or state.view is not view or run is None or run.last != feed.last:
                raise _FeedOver()  # replaced, or its run dropped by a range it did not start
            if check is not None and records:
                if records[0]["SequenceNumber"] != check:
                    raise FeedGap(f"the subscription of {state.key} opened at record {check} sent "
                                  f"{records[0]['SequenceNumber']} first")
                records, check = records[1:], None
            before = view.state()
            if records:
                run.append(records)
                feed.last = records[-1]["SequenceNumber"]
                self.records += len(records)
                self.bytes += page_bytes(records)
                if view.tip is None or seq_key(feed.last) > seq_key(view.tip):
                    view.tip, view.idle = feed.last, 0
                arrived = records[-1].get("ApproximateArrivalTimestamp")
                if isinstance(arrived, (int, float)):
                    view.arrived(feed.last, float(arrived))
            view.behind_ms, view.pending = int(event.get("MillisBehindLatest") or 0), False
            view.probed_at = time.monotonic()
            going = True
            if event_ended(event):
                view.ended = True
                self._on_ended()
            elif held_bytes(run) > self.run_cap():
                # stop reading until a batch takes the run: the connection's flow control holds
                # Kinesis back (a new subscription would wait out the 5 s rule after the batch)
                feed.paused = True
                feed.resume.clear()
                self.pauses += 1
            if view.state() != before:
                self._shards.changed.add(state.key)
            if view.ended:
                raise _FeedOver()
            return check, going

    async def _aio(self) -> Any:
        if self._client is None:
            self._client = await self._settings.aio_client("kinesis", pool=4096)
        return self._client
