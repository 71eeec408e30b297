"""How AWS calls are retried: botocore's standard conditions decide *whether*, this module
decides *how long* to wait and *how often*.

botocore's standard retry mode retries throttling errors, 5xx and transient network errors;
its waits are its own (``rand() * min(2 ** attempt, 20)`` seconds in the release pip installs
today) and it offers no setting for their base. Patching its private backoff object stopped
working when botocore moved that code (issue 23), silently. So each client gets one handler of
ours on the public ``needs-retry`` event, registered first: it asks botocore's standard
conditions whether the attempt may be retried and answers with the delay of
:class:`RetryRule`, or ``False`` (which stops the retry, whatever later handlers say).
botocore's own handler is unregistered where it can be found; if a release renames it, ours
still decides, because the first non-``None`` answer wins.

A Kinesis client of the source's readers hands ``GetRecords`` throttles back at once
(``caller_paced``): the reader's model of the shard's byte budget knows when the next call fits
(``read_rate.py``), which no backoff formula does. Every client hands ``SubscribeToShard``
rate refusals back too (``ALWAYS_CALLER_PACED``): its callers pace it by Kinesis' one call a
second per consumer and shard.

A client that has never had an answer from its endpoint treats "could not connect" as a
configuration error, not an outage, when its rule says so (the driver's clients): a wrong
``endpointUrl`` then fails in about a second instead of after every retry.
"""

from __future__ import annotations

import inspect
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError
from botocore.retries.standard import (
    RetryEventAdapter,
    StandardRetryConditions,
    ThrottledRetryableChecker,
)

log = logging.getLogger(__name__)

# No wait grows past this (botocore's cap too).
MAX_DELAY_S = 20.0
# Errors other than throttling (5xx, dropped connections) wait this share of the base:
# they are usually over in milliseconds, while a throttled shard needs its next second.
NON_THROTTLING_SHARE = 1 / 20
# "Could not connect" before the endpoint ever answered, on a client whose rule fails fast.
UNREACHED_RETRIES = 2

_CONNECT_ERRORS = (EndpointConnectionError, ConnectTimeoutError)
# Throttles that go back to the caller on every client, by operation: Kinesis takes one
# SubscribeToShard a second per consumer and shard and counts refused calls too, so a refusal
# re-sent within the second is refused again (a cascade of LimitExceededException). Its callers
# retry it at the rule's pace (aws/subscribe.py). (Other throttling codes, 5xx and network
# errors are still re-sent here: a subscription's reader would otherwise fail on one.)
ALWAYS_CALLER_PACED = {"SubscribeToShard": frozenset({"LimitExceededException"})}


def is_connect_error(exc: BaseException) -> bool:
    """True for "could not connect to the endpoint" (refused, unknown host, connect timeout)."""
    return isinstance(exc, _CONNECT_ERRORS)


@dataclass(frozen=True)
class RetryRule:
    """How many times a call is retried and how long each retry waits.

    ``max_retries`` retries follow the first attempt (so a call makes at most ``max_retries + 1``
    attempts). Retry ``n`` (1-based) of a throttled call waits between half and all of
    ``min(20 s, base * 2 ** (n - 1))``; other errors use a twentieth of the base. The half
    that is not random is the point: a throttled shard is refused for the rest of its second, so
    a retry a few milliseconds later only spends the quota of the applications it shares.
    """

    max_retries: int
    base_ms: int
    fail_fast_unreached: bool = False
    # Operations whose throttling errors go straight back to the caller, which knows how long
    # the shard's budget needs (read_rate.py): retried there, not after this rule's guess.
    caller_paced: frozenset[str] = frozenset()

    def delay(self, retry: int, throttled: bool, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait before retry number ``retry`` (1-based)."""
        base = self.base_ms / 1000 * (1.0 if throttled else NON_THROTTLING_SHARE)
        step = min(MAX_DELAY_S, base * 2 ** (retry - 1))
        return step * (0.5 + 0.5 * rand())

    def install(self, client: Any) -> RetryHandler:
        """Make this rule decide every retry of ``client`` (a boto3 or aiobotocore client)."""
        events = client.meta.events
        service = client.meta.service_model.service_id.hyphenize()
        events.unregister(f"needs-retry.{service}", unique_id=f"retry-config-{service}")
        handler = RetryHandler(self, is_async=_is_aio(client))
        callback = handler.needs_retry_async if handler.is_async else handler.needs_retry
        events.register_first(
            f"needs-retry.{service}", callback, unique_id=f"kinesis-ddb-retries-{service}"
        )
        return handler


def _is_aio(client: Any) -> bool:
    return inspect.iscoroutinefunction(getattr(client, "_make_api_call", None))


class RetryHandler:
    """One client's retry decisions (it remembers whether its endpoint ever answered)."""

    def __init__(self, rule: RetryRule, is_async: bool) -> None:
        self.rule = rule
        self.is_async = is_async
        self.reached = False
        self._adapter = RetryEventAdapter()
        self._throttled = ThrottledRetryableChecker()
        attempts = rule.max_retries + 1
        if is_async:  # its checks may read a response body, which aiobotocore awaits
            from aiobotocore.retries.standard import AioStandardRetryConditions

            self._conditions: Any = AioStandardRetryConditions(max_attempts=attempts)
        else:
            self._conditions = StandardRetryConditions(max_attempts=attempts)

    def needs_retry(self, **kwargs: Any) -> float | bool:
        """The ``needs-retry`` handler of a boto3 client."""
        context = self._adapter.create_retry_context(**kwargs)
        return self._decide(context, self._conditions.is_retryable(context))

    async def needs_retry_async(self, **kwargs: Any) -> float | bool:
        """The ``needs-retry`` handler of an aiobotocore client."""
        context = self._adapter.create_retry_context(**kwargs)
        retryable = self._conditions.is_retryable(context)
        if inspect.isawaitable(retryable):
            retryable = await retryable
        return self._decide(context, retryable)

    def _decide(self, context: Any, retryable: bool) -> float | bool:
        if context.http_response is not None:
            self.reached = True
        # What the caller's error says ("reached max retries: N") comes from this metadata.
        self._adapter.adapt_retry_response_from_context(context)
        if not retryable:
            return False
        retry = context.attempt_number
        error = context.caught_exception
        if (
            self.rule.fail_fast_unreached
            and not self.reached
            and error is not None
            and is_connect_error(error)
            and retry > UNREACHED_RETRIES
        ):
            return False
        throttled = bool(self._throttled.is_retryable(context))
        operation = getattr(context.operation_model, "name", "?")
        handed_back = ALWAYS_CALLER_PACED.get(operation, frozenset())
        if throttled and (operation in self.rule.caller_paced or _code(context) in handed_back):
            return False
        wait = self.rule.delay(retry, throttled)
        log.debug(
            "Retry %d of %d of %s in %.3f s (%s)",
            retry,
            self.rule.max_retries,
            operation,
            wait,
            "throttled" if throttled else _what(context),
        )
        return wait


def _code(context: Any) -> str | None:
    return (context.parsed_response or {}).get("Error", {}).get("Code")


def _what(context: Any) -> str:
    if context.caught_exception is not None:
        return type(context.caught_exception).__name__
    code = _code(context)
    status = getattr(context.http_response, "status_code", None)
    return f"{code or 'HTTP'} {status}"
