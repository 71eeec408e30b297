"""Enhanced fan-out (EFO): exact ranges read by ``SubscribeToShard`` (the consumer's
lifecycle is the driver's: ``driver/consumers.py``).

An EFO consumer gets its own 2 MB/s per shard, pushed over a subscription instead of polled with
``GetRecords``. :class:`SubscribeRangeReader` replays one exact :class:`ShardRange` that way and
yields pages shaped exactly like the polling reader's (same record dicts, same order, same
data-loss check: both follow ``cursor.py``), so the rest of the read path does not know which
one ran.

Retries follow the project's rule: botocore's standard retry mode handles throttling, 5xx and
network errors of each call; tenacity handles only what botocore cannot: resubscribing after an
error *inside* a subscription's event stream (an
exception event, a connection dropped mid-stream) or a ``ResourceInUseException`` while an
earlier subscription of the same consumer and shard lingers (Kinesis refuses a new one within
5 seconds of the previous).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator
from typing import Any

from botocore.eventstream import ParserError
from botocore.exceptions import ClientError
from tenacity import (
    Retrying,
    retry_if_exception,
    wait_exponential,
)

from kinesis_source.aws.clients import error_code
from kinesis_source.aws.kinesis import (
    IN_USE,
    INVALID_ARGUMENT,
    NOT_FOUND,
    missing_shard_or_stream,
    readable_error,
)
from kinesis_source.aws.subscribe import (
    CALL_GAP_S,
    IN_USE_GAP_S,
    Attempts,
    event_ended,
    recoverable,
    starting_position,
    subscription_wait,
)
from kinesis_source.errors import (
    KinesisSourceError,
    ShardNotFoundError,
    SubscriptionEndedEarly,
)
from kinesis_source.executor.cursor import RangeReaderBase, RawPage
from kinesis_source.executor.watch import start_watch, stop_watch, watching
from kinesis_source.positions import Position, ShardRange
from kinesis_source.tip_reports import WATCH_LIVE, ReportAddress, TipReport

log = logging.getLogger(__name__)


# When this process last subscribed, per (consumer ARN, shard): Spark reuses its Python
# workers, so a shard's next range (or a resubscription within a range) often runs here, and
# waits out the 5 s itself instead of being refused.
_last_subscribed: dict[tuple[str, str], float] = {}
# When this process last called SubscribeToShard, refused or failed calls too (Kinesis counts
# them under its one call a second), per (consumer ARN, shard): a retried task, or a range read
# after a failed one, in this process does not call again within the second.
_last_called: dict[tuple[str, str], float] = {}
_last_lock = threading.Lock()


class SubscribeRangeReader(RangeReaderBase):
    """Replays one exact :class:`ShardRange` over EFO subscriptions of ``consumer_arn``.

    ``pages()`` (the template's) yields the same record dicts, in the same order, as the
    polling reader does for the range. A subscription that ends (Kinesis
    ends each after 5 minutes) or fails recoverably is renewed after the last record read;
    ``max_attempts`` failures in a row (with exponential waits from ``retry_wait_s`` up to
    ``max_wait_s``; a subscription Kinesis refuses under its per-shard rules is tried again
    a second later, and such refusals count apart: ``aws/subscribe.py``'s ``Attempts``) end
    the read with the error. A subscription of a shard this process made less
    than 5 s before waits the rest of the 5 s instead of being refused. With ``watch_to``, a
    subscription that outlives the range goes on as the shard's tip watch
    (``executor/watch.py``), reporting there.
    """

    CARRIES = False  # the driver carries no ranges in fan-out: each range is a subscription

    def __init__(
        self,
        client: Any,
        consumer_arn: str,
        rng: ShardRange,
        fail_on_data_loss: bool = True,
        max_attempts: int = 8,
        retry_wait_s: float = 0.5,
        max_wait_s: float = 5.0,
        in_use_gap_s: float = IN_USE_GAP_S,
        watch_to: ReportAddress | None = None,
    ) -> None:
        super().__init__(rng, fail_on_data_loss, mode="EFO")
        self._client = client
        self._consumer_arn = consumer_arn
        self._max_attempts = max_attempts
        self._backoff = wait_exponential(multiplier=retry_wait_s, max=max_wait_s)
        self._in_use_gap_s = in_use_gap_s
        self._watch_to = watch_to
        self._stream: Any = None  # the current subscription's EventStream
        self._events: Iterator[dict] | None = None
        self._got_event = False
        self.subscriptions = 0
        self.failures = 0  # recoverable errors got past
        self.subscribed_at: float | None = None  # wall clock of the last successful subscription

    def _subscribe(self) -> None:
        rng = self._range
        position = self._cursor.opening()
        try:
            resp = self._subscribe_at(position)
        except ClientError as exc:
            if error_code(exc) != INVALID_ARGUMENT:
                raise
            position = self._cursor.refused()
            resp = self._subscribe_at(position)
        self.subscriptions += 1
        log.debug("subscribed to %s at %s", rng, position)
        self._stream = resp["EventStream"]
        self._events = iter(self._stream)
        self._got_event = False

    def _subscribe_at(self, position: Position) -> Any:
        rng = self._range
        key = (self._consumer_arn, rng.shard_id)
        stop_watch(*key)  # this process's own watch of the shard: the read takes over
        with _last_lock:
            last, called = _last_subscribed.get(key, -math.inf), _last_called.get(key, -math.inf)
        time.sleep(max(0.0, last + self._in_use_gap_s - time.monotonic(), called + CALL_GAP_S - time.monotonic()))
        with _last_lock:
            _last_called[key] = time.monotonic()
        try:
            resp = self._client.subscribe_to_shard(
                ConsumerARN=self._consumer_arn,
                ShardId=rng.shard_id,
                StartingPosition=starting_position(position),
            )
        except ClientError as exc:
            code = error_code(exc)
            # A consumer being deleted refuses subscriptions as "in use": no wait makes it usable
            # again, so that refusal is told apart from Kinesis' per-shard rules, not retried.
            if code == NOT_FOUND or (code == IN_USE and not self._consumer_exists()):
                raise self._not_found(exc) from exc
            raise
        with _last_lock:
            _last_subscribed[key] = time.monotonic()
        self.subscribed_at = time.time()
        return resp

    def _not_found(self, exc: ClientError) -> Exception:
        """What a ``ResourceNotFoundException`` (from the call, or inside the event stream when
        something is deleted mid-read) means: the shard gone (data loss, as
        ``failOnDataLoss`` says), or the consumer or the stream deleted."""
        rng = self._range
        if self._consumer_exists():
            missing = missing_shard_or_stream(self._client, rng.stream, rng.shard_id, exc)
            if isinstance(missing, ShardNotFoundError):
                return missing
            return KinesisSourceError(
                f"Cannot read {rng.shard} with EFO consumer {self._consumer_arn}: the stream "
                f"was not found; check option 'streamName' (or 'streamARN'). AWS said: {exc}"
            )
        return KinesisSourceError(
            f"Cannot read {rng.shard} with EFO consumer {self._consumer_arn}: the consumer was "
            "not found (deregistered while the query ran: by `kinesis-ddb consumers deregister`, "
            "another query's deregisterConsumer=true, or by hand). Restarting the query registers "
            f"it again. AWS said: {exc}"
        )

    def _in_stream(self, exc: ClientError) -> Exception:
        """An exception event: a recoverable one as it is (resubscribed), the others worded
        like the same errors of a call."""
        code = error_code(exc)
        if code == NOT_FOUND:
            return self._not_found(exc)
        if code == IN_USE:
            # Within a query one task reads a shard at a time: a subscription taken over comes
            # from elsewhere.
            log.warning(
                "the subscription of %s through EFO consumer %s was taken over by another "
                "SubscribeToShard: another query or application reads through the same consumer "
                "(give each its own 'consumerName'); resubscribing", self._range, self._consumer_arn,
            )
        return readable_error(exc, self._range.stream, self._range.shard_id) or exc

    def _unreadable(self, exc: ParserError) -> KinesisSourceError:
        return KinesisSourceError(
            f"Cannot read {self._range.shard} by enhanced fan-out after "
            f"{self._cursor.position}: an event of its subscription could not be parsed "
            f"({exc}). botocore reads event-stream messages of at most 24 MiB, and records of up "
            "to 10 MiB travel base64-encoded (4/3 of their size), so an event carrying a few "
            "large records can exceed it. Read this stream with consumerMode=polling, whose "
            "GetRecords responses hold at most 10 MiB."
        )

    def _consumer_exists(self) -> bool:
        """True while the consumer is there and not being deleted."""
        try:
            resp = self._client.describe_stream_consumer(ConsumerARN=self._consumer_arn)
        except ClientError as exc:
            if error_code(exc) == NOT_FOUND:
                return False
            raise
        return resp.get("ConsumerDescription", {}).get("ConsumerStatus") != "DELETING"

    def _close(self) -> None:
        stream, self._stream, self._events = self._stream, None, None
        if stream is not None:
            try:
                stream.close()
            except Exception:  # noqa: BLE001 - a broken connection is being dropped anyway
                log.debug("closing a subscription of %s failed", self._range, exc_info=True)

    def _finish(self) -> None:
        """A complete range's subscription goes on as the shard's tip watch, when the driver
        takes reports and the shard did not end with the range."""
        page, events = self._last_page, self._events
        if self._watch_to is None or page is None or page.shard_ended or events is None or not page.records:
            self._close()
            return
        stream = self._stream
        self._stream = self._events = None
        if not start_watch(self._consumer_arn, self._range.shard, self._watch_to,
                           page.records[-1]["SequenceNumber"], page.behind_ms, self.subscribed_at, events,
                           stream.close):
            stream.close()

    def watch_report(self) -> TipReport | None:
        """The report that this read's subscription goes on as the shard's tip watch (None when
        it did not, or the watch has ended already)."""
        tip = self.tip_report()
        if tip is None or self._watch_to is None or not watching(self._consumer_arn, self._range.shard_id):
            return None
        return TipReport(tip.shard, tip.seq, tip.behind_ms, subscribed_at=tip.subscribed_at, watch=WATCH_LIVE)

    def _subscribed(self) -> float | None:
        return self.subscribed_at

    def _on_retry(self, state: Any) -> None:
        self.failures += 1
        log.info(
            "EFO subscription of %s failed (%s); resubscribing after %s",
            self._range,
            state.outcome.exception(),
            self._cursor.position,
        )

    def _next_event(self) -> dict | None:
        """The next ``SubscribeToShardEvent``, or None when there is none to process (the
        subscription ended normally: the caller asks again, which resubscribes)."""
        retrying = Retrying(
            retry=retry_if_exception(recoverable),
            stop=Attempts(self._max_attempts),
            wait=subscription_wait(self._backoff),
            before_sleep=self._on_retry,
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                if self._events is None:
                    self._subscribe()
                try:
                    message = next(self._events)  # type: ignore[arg-type]
                except ClientError as exc:  # an exception event inside the stream
                    self._close()
                    raise self._in_stream(exc) from None
                except ParserError as exc:  # resubscribing would meet the same event again
                    self._close()
                    raise self._unreadable(exc) from None
                except StopIteration:
                    ended_early = not self._got_event
                    self._close()
                    if ended_early:
                        raise SubscriptionEndedEarly(
                            f"a subscription of {self._range} was empty"
                        ) from None
                    return None
                except BaseException:
                    self._close()
                    raise
                self._got_event = True
                # None for an event type this reader does not know (none today): skipped.
                return message.get("SubscribeToShardEvent")
        raise AssertionError("unreachable")  # pragma: no cover

    def _next_page(self) -> RawPage | None:
        event = self._next_event()
        if event is None:
            return None
        behind = int(event.get("MillisBehindLatest") or 0)
        ended = event_ended(event)
        return RawPage(
            event.get("Records") or [],
            shard_ended=ended,
            at_tip=behind == 0,
            behind_ms=behind,
        )
