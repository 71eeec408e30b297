"""What every ``SubscribeToShard`` caller shares: Kinesis' rules for subscriptions, where one
opens, which of its failures a new subscription gets past, and what an event says.

Two callers follow these rules: an executor read of one range (``executor/fanout.py``,
``efoSubscriptions=range``) and the driver's subscriptions held for the query's life
(``driver/feeds.py``, ``efoSubscriptions=query``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError
from urllib3.exceptions import HTTPError as Urllib3Error

from kinesis_source.aws.clients import error_code
from kinesis_source.aws.kinesis import IN_USE, LIMIT_EXCEEDED
from kinesis_source.errors import SubscriptionEndedEarly
from kinesis_source.positions import Position

# Kinesis refuses a SubscribeToShard of one consumer and shard within 5 s of the last
# successful one (ResourceInUseException), and takes one such call per second
# (LimitExceededException): a refused call is tried again a second later, not on a backoff.
IN_USE_GAP_S = 5.0
CALL_GAP_S = 1.0
# The driver waits a little more than the 5 s before a shard's next subscription: it learns the
# last one's time from another process's clock (an executor's report).
DRIVER_GAP_S = 5.1
# Refusals under those rules a read takes, in a row, before it gives up (a minute or more): they
# say another subscriber of the consumer and shard is there, not that something is broken, so
# they do not spend the attempts a read has for failures.
MAX_RULE_REFUSALS = 60

# Errors of a subscription that a new subscription can get past.
RECOVERABLE_CODES = frozenset({
    "InternalFailureException",
    "InternalFailure",
    "ServiceUnavailable",
    IN_USE,
    LIMIT_EXCEEDED,  # one SubscribeToShard per second per consumer and shard
    "KMSThrottlingException",
})


def _network_errors() -> tuple[type[BaseException], ...]:
    # A connection reset or timeout in the middle of the event stream: botocore and aiobotocore
    # read the stream through urllib3 or aiohttp directly, so these are not wrapped (nor retried).
    errors: tuple[type[BaseException], ...] = (
        HTTPClientError, BotoConnectionError, Urllib3Error, ConnectionError, TimeoutError,
    )
    try:
        import aiohttp
    except ImportError:  # pragma: no cover - aiobotocore depends on it
        return errors
    return (*errors, aiohttp.ClientError)


NETWORK_ERRORS = _network_errors()


def refused_by_rule(exc: BaseException | None) -> bool:
    """True for a ``SubscribeToShard`` refused under Kinesis' per-shard rules (5 s, 1 call/s)."""
    return isinstance(exc, ClientError) and error_code(exc) in (IN_USE, LIMIT_EXCEEDED)


def rule_wait(exc: BaseException | None) -> float:
    """How long a call refused under the per-shard rules waits: a second after an "in use"
    refusal (the rate the rules allow); one to two seconds, at random, after a rate refusal,
    which says another caller of the same consumer and shard is calling too: two callers that
    each wait exactly a second after their refusal refuse each other's every call."""
    if isinstance(exc, ClientError) and error_code(exc) == LIMIT_EXCEEDED:
        return CALL_GAP_S * (1.0 + random.random())
    return CALL_GAP_S


def subscription_wait(backoff: Callable[[Any], float]) -> Callable[[Any], float]:
    """tenacity's wait for a subscription's tries: :func:`rule_wait` after a refusal under the
    per-shard rules, ``backoff`` after any other failure."""

    def wait(state: Any) -> float:
        exc = state.outcome.exception()
        return rule_wait(exc) if refused_by_rule(exc) else backoff(state)

    return wait


class Attempts:
    """tenacity's stop for a subscription's tries: ``max_attempts`` failures in a row, refusals
    under the per-shard rules apart (another subscriber of the consumer and shard is there, not
    a failure), of which ``max_refusals`` in a row end the tries too."""

    def __init__(self, max_attempts: int, max_refusals: int = MAX_RULE_REFUSALS) -> None:
        self.max_attempts = max_attempts
        self.max_refusals = max_refusals
        self.refusals = 0

    def __call__(self, state: Any) -> bool:
        if refused_by_rule(state.outcome.exception()):
            self.refusals += 1
            return self.refusals >= self.max_refusals
        return bool(state.attempt_number - self.refusals >= self.max_attempts)


def recoverable(exc: BaseException) -> bool:
    """True for a failure of a subscription that a new subscription can get past."""
    if isinstance(exc, SubscriptionEndedEarly):
        return True
    if isinstance(exc, ClientError):
        return error_code(exc) in RECOVERABLE_CODES
    return isinstance(exc, NETWORK_ERRORS)


def starting_position(position: Position) -> dict[str, Any]:
    """``SubscribeToShard``'s ``StartingPosition`` for a position (as ``GetShardIterator``'s
    arguments would open it)."""
    args = position.iterator_args()
    out: dict[str, Any] = {"Type": args["ShardIteratorType"]}
    if "StartingSequenceNumber" in args:
        out["SequenceNumber"] = args["StartingSequenceNumber"]
    if "Timestamp" in args:
        out["Timestamp"] = args["Timestamp"]
    return out


def event_ended(event: dict) -> bool:
    """True when a ``SubscribeToShardEvent`` is the shard's last: Kinesis puts a continuation
    sequence number in every event of an open shard; a null one (which botocore's parser leaves
    out) is the shard's end, with or without ChildShards."""
    return bool(event.get("ChildShards")) or event.get("ContinuationSequenceNumber") is None
