"""An executor read's one gate to Kinesis: every call it makes on its shard, paced.

The driver's gate is ``driver/budget.py``'s ``PacedKinesis`` (a ledger of each shard's call
windows and byte model). An executor read gets its share of that budget with its range: the
time its first calls are booked for, the spacing of its later pages, the shard's byte model.
:class:`ShardGate` keeps to them for every ``GetShardIterator`` and ``GetRecords`` of the read,
counts them with their times (they go back to the driver in the tip report, to replace the
booking in the shard's windows), and retries a throttled call when the byte model says.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from botocore.exceptions import ClientError
from tenacity import Retrying

from kinesis_source.aws.clients import error_code
from kinesis_source.aws.kinesis import (
    NOT_FOUND,
    Page,
    is_throttled,
    missing_shard_or_stream,
    readable_error,
    received_at,
    throttle_retry,
)
from kinesis_source.positions import Position, ShardRange
from kinesis_source.read_rate import RateState, ShardBytes, page_bytes, retried_state

log = logging.getLogger(__name__)

MAX_BOOKED_WAIT_S = 5.0
# Pages after the first wait up to this share of the interval more, at random: a reader whose
# calls keep one phase against another application's can take the bucket just before each of
# its calls, every time (measured in a simulation of the two; see read_rate.py).
PAGE_JITTER = 0.25


class ShardGate:
    """The calls of one read of one shard (see the module docstring)."""

    def __init__(self, client: Any, rng: ShardRange, page_interval_s: float = 0.0, not_before: float = 0.0,
                 rate: RateState | None = None, max_rate: float | None = None, attempts: int = 11,
                 stream_arn: str | None = None, held_interval_s: float | None = None,
                 second_at: float | None = None, retried: bool = False, records: int | None = None) -> None:
        """The options are ``RangeReader``'s, which says what each means."""
        self._client = client
        self._range = rng
        self._interval = page_interval_s
        self._held_interval = held_interval_s
        self._second_at = second_at if held_interval_s is not None else None
        self._not_before = not_before
        self._last_call: float | None = None
        self._attempts = attempts
        self._arn_arg = {"StreamARN": stream_arn} if stream_arn else {}
        self.calls = 0
        self.call_times: dict[str, list[float]] = {"GetRecords": [], "GetShardIterator": []}
        now = time.time()
        if retried:
            size = rate.record_bytes if rate is not None and rate.record_bytes else 0.0
            rate = retried_state(rate, (records or 0) * size, now)
        self.bytes = ShardBytes(max_rate, rate, now, own_debt=retried)

    def _called(self, op: str) -> None:
        self.calls += 1
        self.call_times[op].append(time.time())

    def reported_calls(self) -> dict[str, list[float]]:
        """The calls made, by operation, with their times (epoch seconds)."""
        return {op: times for op, times in self.call_times.items() if times}

    def _spacing(self, calls: int | None = None) -> float:
        """Least time before the next ``GetRecords`` after ``calls`` of them (default: those
        made): the whole budget where the driver holds its probes of the shard while it is read;
        but before the second call, the read's share of the budget, unless the driver said when
        its last probe leaves room for that call (``second_at``; a probe may have come just
        before the first)."""
        calls = len(self.call_times["GetRecords"]) if calls is None else calls
        if self._held_interval is not None and (calls >= 2 or (calls == 1 and self._second_at is not None)):
            return self._held_interval
        return self._interval

    def _second_wait(self, calls: int, now: float) -> float:
        """How long the call after ``calls`` must wait for the driver's probes before the read
        to leave its window (the second call only): never longer than the read's share's
        spacing, which holds whatever the driver said (its clock may be off this host's)."""
        if calls != 1 or self._second_at is None:
            return 0.0
        return min(self._second_at - now, self._interval)

    def _booked_wait(self) -> float:
        """Before the read's first call: how long until the time the driver booked it for (a
        clock skew between the hosts shifts it by at most ``MAX_BOOKED_WAIT_S``)."""
        return min(MAX_BOOKED_WAIT_S, self._not_before - time.time()) if self._last_call is None else 0.0

    def _pace(self, records: int, left: int | None, rest: int | None) -> int:
        """Wait for the shard's budgets and return the call's ``Limit`` (``records``: what the
        read wants; ``left``: what the range still holds when that fits one call; ``rest``:
        what it still holds, when its size is known). Calls: the driver booked the first (a
        clock skew between the hosts shifts it by at most ``MAX_BOOKED_WAIT_S``); later pages
        keep this reader's share apart. Bytes: until the model holds what the call is worth;
        the ``Limit`` is what it holds."""
        model, interval = self.bytes, self._spacing()
        calls = len(self.call_times["GetRecords"])
        if self._last_call is None:
            wait = self._booked_wait()
        else:
            spacing = interval * (1 + PAGE_JITTER * random.random())
            wait = max(self._last_call + spacing - time.monotonic(), self._second_wait(calls, time.time()))
        wait = max(wait, model.wait_s(model.want_bytes(records, interval), time.time()))
        next_spacing = self._spacing(calls=calls + 1)
        if left is not None and model.record_bytes is not None:  # the rest fits one call
            wait = model.end_wait(left * model.record_bytes, wait, next_spacing, time.time())
        if wait > 0:
            time.sleep(wait)  # pacing to the shard's budgets, not waiting on a condition
        self._last_call = time.monotonic()
        lead_s = None
        if self._beyond_a_bucket(left, rest):  # the time until the next call could come, at most
            lead_s = max(next_spacing * (1 + PAGE_JITTER), self._second_wait(calls + 1, time.time()))
        return model.limit(records, time.time(), lead_s)

    def _beyond_a_bucket(self, left: int | None, rest: int | None) -> bool:
        """True when the rest of the range may take more than a full bucket: its size is
        unknown (a catch-up's first range, whose backlog nobody counted) and no estimate says
        it fits a call, or its count at the shard's record size exceeds a bucket. Only such a
        read takes a lead page from a full bucket: a read that fits one call would pay the lead
        page with a second call a spacing later."""
        if rest is None:
            return left is None
        return not self.bytes.holds(rest * self.bytes.record_size())

    def page(self, iterator: str, records: int, left: int | None, rest: int | None) -> Page:
        """One ``GetRecords`` on ``iterator`` within the shard's budgets (see :meth:`_pace`); a
        throttled call is tried again (its wait is the model's)."""
        for attempt in Retrying(**throttle_retry(self._attempts)):
            with attempt:
                limit = self._pace(records, left, rest)
                self._called("GetRecords")
                try:
                    resp = self._client.get_records(ShardIterator=iterator, Limit=limit, **self._arn_arg)
                except ClientError as exc:
                    if is_throttled(exc):
                        log.info("GetRecords on %s throttled: another application reads the shard too", self._range)
                        self.bytes.refused(time.time())
                    readable = readable_error(exc, self._range.stream, self._range.shard_id)
                    if readable is not None:
                        raise readable from None
                    raise
                finally:
                    # spaced from the answer, which came after the call arrived: the server never
                    # sees this reader's calls closer than its spacing, however long the way
                    self._last_call = time.monotonic()
        page = Page.from_api(resp)
        self.bytes.spend(page_bytes(page.records), len(page.records), received_at(time.time()))
        return page

    def iterator(self, position: Position) -> str:
        """A ``GetShardIterator`` at ``position``, at the time the driver booked it for (the
        read's first call)."""
        wait = self._booked_wait()
        if wait > 0:
            time.sleep(wait)  # pacing to the shard's call budget, not waiting on a condition
        rng = self._range
        self._called("GetShardIterator")
        try:
            resp = self._client.get_shard_iterator(
                StreamName=rng.stream, ShardId=rng.shard_id, **position.iterator_args()
            )
        except ClientError as exc:
            if error_code(exc) != NOT_FOUND:
                raise
            raise missing_shard_or_stream(self._client, rng.stream, rng.shard_id, exc) from exc
        return resp["ShardIterator"]
