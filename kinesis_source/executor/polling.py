"""Replaying one exact range by polling: ``GetShardIterator`` + ``GetRecords`` pages.

A range usually starts where the driver's last probe of the shard read: the partition then
carries that iterator and the record found first after the start, and the read costs no
``GetShardIterator``. The hand-over is trusted only when that same record comes first again;
otherwise (the iterator expired, the records were trimmed meanwhile) the page is dropped and
the range opens as usual, with the check of the record before the start. Pages after the
first are spaced by the partition's share of the shard's call budget, and every call waits for
the shard's byte budget and asks for a ``Limit`` that fits it (``read_rate.py``): the model's
state comes from the driver with the range and goes back with the tip report. A throttled call
is tried again when the model says, the model having learnt that others read the shard too.
"""

from __future__ import annotations

import itertools
import logging
import math
import random
import time
from typing import Any

from botocore.exceptions import ClientError
from tenacity import (
    Retrying,
)

from kinesis_source.aws.clients import error_code
from kinesis_source.aws.kinesis import (
    INVALID_ARGUMENT,
    NOT_FOUND,
    Page,
    arrival_seconds,
    expiry_retry,
    is_expired,
    is_throttled,
    missing_shard_or_stream,
    readable_error,
    received_at,
    throttle_retry,
)
from kinesis_source.executor.cursor import RangeReaderBase, RawPage
from kinesis_source.positions import AFTER, Position, ShardRange, seq_key
from kinesis_source.read_rate import (
    MIN_RATE_SPAN_S,
    RateState,
    ShardBytes,
    page_bytes,
    records_between,
    retried_state,
)

log = logging.getLogger(__name__)

MAX_BOOKED_WAIT_S = 5.0
# A range that holds more records than planning estimated is read on in calls for at least this
# share of the estimate.
FOLLOW_UP_SHARE = 0.25
# Pages after the first wait up to this share of the interval more, at random: a reader whose
# calls keep one phase against another application's can take the bucket just before each of
# its calls, every time (measured in a simulation of the two; see read_rate.py).
PAGE_JITTER = 0.25


class RangeReader(RangeReaderBase):
    """Replays one exact :class:`ShardRange` with a synchronous client, page by page."""

    def __init__(
        self,
        client: Any,
        rng: ShardRange,
        limit: int,
        fail_on_data_loss: bool = True,
        opener: tuple[str, str | None] | None = None,
        page_interval_s: float = 0.0,
        not_before: float = 0.0,
        records: int | None = None,
        rate: RateState | None = None,
        max_rate: float | None = None,
        attempts: int = 11,
        stream_arn: str | None = None,
        held_interval_s: float | None = None,
        end_at: float | None = None,
        carried: tuple[dict, ...] = (),
        second_at: float | None = None,
        retried: bool = False,
    ) -> None:
        """``records``: how many records the range holds, when planning knows or estimates it
        (then each call asks for what is left of them, not ``limit``: records past the end would
        be read again by the next batch, from the shard's shared 2 MiB/s; past an estimate that
        fell short, for ``FOLLOW_UP_SHARE`` of it at a time). ``rate``: the shard's byte model
        as the driver handed it (None: a full bucket); ``max_rate``: ``maxReadRatePerShard``;
        ``attempts``: most tries of a throttled call (``maxRetries`` + 1); ``stream_arn``: the
        stream's ARN when it was given by ARN (``GetRecords`` names it); ``held_interval_s``:
        the spacing of pages after the second while the driver holds its probes of the shard
        (the read then has the shard's whole call budget; None: ``page_interval_s`` always);
        ``end_at``: when the range's end record arrived (epoch seconds, the server's clock),
        for a range of unknown size: the read then estimates what is left from its records'
        arrivals, to time its last call. ``carried``: the range's first records, which the
        driver already read (``driver/carried.py``): they are the read's first page, with no
        call; the rest, if any, is read with ``opener`` (an iterator after them) or a new
        iterator. ``second_at``: when the shard's call budget has room for the read's second
        ``GetRecords`` (epoch seconds), given the driver's probes before the read: with
        ``held_interval_s``, the second call waits for that and ``held_interval_s`` instead of
        ``page_interval_s``. ``retried``: Spark runs this read again (a retried or speculative
        task): an earlier attempt may have spent the byte state handed over, so the read starts
        from a state no fuller than the shard's (:func:`retried_state`) and takes its first refusal for that
        attempt's bytes, not for another application's."""
        super().__init__(rng, fail_on_data_loss)
        self._client = client
        self._limit = limit
        self._records = records
        self._iterator: str | None = None
        self._opener = opener
        self._interval = page_interval_s
        self._held_interval = held_interval_s
        self._last_call: float | None = None
        self._not_before = not_before
        self.calls = 0
        self.call_times: dict[str, list[float]] = {"GetRecords": [], "GetShardIterator": []}
        self.expiries = 0
        self.handed_over = False  # the driver's iterator served the first page
        now = time.time()
        if retried:
            size = rate.record_bytes if rate is not None and rate.record_bytes else 0.0
            rate = retried_state(rate, (records or 0) * size, now)
        self.bytes = ShardBytes(max_rate, rate, now, own_debt=retried)
        self._attempts = attempts
        self._arn_arg = {"StreamARN": stream_arn} if stream_arn else {}
        self._end_at = end_at
        # (a record's arrival, records received up to it): the first record and each page's last
        self._marks: list[tuple[float, int]] = []
        # records arrive in bunches (a PutRecords' records share one arrival): how many of the
        # last records read share the last one's arrival, and the most seen sharing one
        self._bunch = 0
        self._widest = 0
        self._carried: list[dict] | None = list(carried) if carried else None
        self._second_at = second_at if held_interval_s is not None else None

    def _handed_over_page(self) -> Page | None:
        """The first page from the driver's iterator, if it starts with the expected record."""
        assert self._opener is not None
        iterator, first = self._opener
        self._opener = None
        try:
            page = self._paced_page(iterator)
        except ClientError as exc:
            if not is_expired(exc) and error_code(exc) != INVALID_ARGUMENT:
                raise
            return None
        if not page.records or not self._opens_range(page.records[0]["SequenceNumber"], first):
            log.info("the driver's iterator for %s did not start at %s; opening anew", self._range, first)
            return None
        self.handed_over = True
        return page

    def _opens_range(self, got: str, first: str | None) -> bool:
        """True when a handed-over iterator's first record is the one expected at the range's
        start: the one the probe found there, or (for an iterator that an earlier read reported
        after the start's record, its first record unknown) any record after the start."""
        if first is not None:
            return got == first
        start = self._cursor.position  # (after the records carried, if any)
        return start.kind == AFTER and start.seq is not None and seq_key(got) > seq_key(start.seq)

    def _page_limit(self) -> int:
        """``Limit`` of the next call: what the range still holds (and the opening's check
        record), when its size is known; else ``limit``."""
        if self._records is None:
            return self._limit
        cursor = self._cursor
        left = self._records - cursor.read
        if left <= 0:
            # More than planning counted or estimated: read on in steps, not to the tip (what
            # lies past the end is read again by the next batch); a part of the range first,
            # then doubling what was read past the estimate, so that a far-off one costs a
            # few calls.
            left = max(math.ceil(self._records * FOLLOW_UP_SHARE), -left)
        return max(1, min(self._limit, left + (1 if cursor.unchecked else 0)))

    def _left(self, records: int) -> int | None:
        """Records the range still holds, when they fit one call (``records``: the next call's
        ``Limit``): counted or estimated by planning, or, for a range of unknown size whose end
        record's arrival is known, estimated at the rate its last records arrived (the latest
        pages spanning ``MIN_RATE_SPAN_S``: producers' rates drift, and the rest of the range
        arrived right after them). None otherwise."""
        if self._records is not None:
            return records if records < self._limit else None
        marks = self._marks
        if self._end_at is None or not marks:
            return None
        last_at, received = marks[-1]
        since = next((i for i in range(len(marks) - 2, -1, -1) if last_at - marks[i][0] >= MIN_RATE_SPAN_S), None)
        if since is None:
            return None
        del marks[:since]  # (later estimates start no earlier: the span only grows)
        from_at, from_received = marks[0]
        left = records_between(last_at, self._end_at, (received - from_received) / (last_at - from_at))
        # a page that ended inside a bunch left the rest of it, arrived with its last record
        left += max(0, self._widest - self._bunch)
        return left if left < self._limit else None

    def _seen(self, records: list[dict]) -> None:
        """Note the arrivals of a page's records (for :meth:`_left`)."""
        if self._end_at is None or not records or "ApproximateArrivalTimestamp" not in records[-1]:
            return
        last_at = arrival_seconds(records[-1])
        first = records[0].get("ApproximateArrivalTimestamp")
        first_at = last_at if first is None else arrival_seconds(records[0])
        arrived = [r.get("ApproximateArrivalTimestamp") for r in records]
        bunches = [sum(1 for _ in same) for _, same in itertools.groupby(arrived)]
        if self._marks:
            previous_at, received = self._marks[-1]
            if first is not None and first_at == previous_at:  # the page before ended inside this bunch
                bunches[0] += self._bunch
        else:
            received = 0
            self._marks.append((first_at, 1))
        self._marks.append((last_at, received + len(records)))
        self._bunch = bunches[-1]
        self._widest = max(self._widest, *bunches)

    def _called(self, op: str) -> None:
        self.calls += 1
        self.call_times[op].append(time.time())

    def _reported_calls(self) -> dict[str, list[float]]:
        return {op: times for op, times in self.call_times.items() if times}

    def _rate_state(self) -> RateState | None:
        return self.bytes.state(time.time())

    def _throttled(self) -> int:
        return self.bytes.throttles

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

    def _wait_booked(self) -> None:
        wait = self._booked_wait()
        if wait > 0:
            time.sleep(wait)  # pacing to the shard's call budget, not waiting on a condition

    def _pace(self) -> int:
        """Wait for the shard's budgets and return the call's ``Limit``. Calls: the driver
        booked the first (a clock skew between the hosts shifts it by at most
        ``MAX_BOOKED_WAIT_S``); later pages keep this reader's share apart. Bytes: until the
        model holds what the call is worth; the ``Limit`` is what it holds."""
        records, model, interval = self._page_limit(), self.bytes, self._spacing()
        calls = len(self.call_times["GetRecords"])
        if self._last_call is None:
            wait = self._booked_wait()
        else:
            spacing = interval * (1 + PAGE_JITTER * random.random())
            wait = max(self._last_call + spacing - time.monotonic(), self._second_wait(calls, time.time()))
        wait = max(wait, model.wait_s(model.want_bytes(records, interval), time.time()))
        next_spacing = self._spacing(calls=calls + 1)
        left = self._left(records)
        if left is not None and model.record_bytes is not None:  # the rest fits one call
            wait = model.end_wait(left * model.record_bytes, wait, next_spacing, time.time())
        if wait > 0:
            time.sleep(wait)  # pacing to the shard's budgets, not waiting on a condition
        self._last_call = time.monotonic()
        lead_s = None
        if self._beyond_a_bucket(left):  # the time until the next call could come, at most
            lead_s = max(next_spacing * (1 + PAGE_JITTER), self._second_wait(calls + 1, time.time()))
        return model.limit(records, time.time(), lead_s)

    def _beyond_a_bucket(self, left: int | None) -> bool:
        """True when the rest of the range may take more than a full bucket (``left``: what
        :meth:`_left` found): its size is unknown (a catch-up's first range, whose backlog
        nobody counted) and no estimate says it fits a call, or its count at the shard's record
        size exceeds a bucket. Only such a read takes a lead page from a full bucket: a read that
        fits one call would pay the lead page with a second call a spacing later."""
        if self._records is None:
            return left is None
        rest = max(0, self._records - self._cursor.read)
        return not self.bytes.holds(rest * self.bytes.record_size())

    def _paced_page(self, iterator: str) -> Page:
        """One ``GetRecords`` on ``iterator`` within the shard's budgets; a throttled call is
        tried again (its wait is the model's, in :meth:`_pace`)."""
        for attempt in Retrying(**throttle_retry(self._attempts)):
            with attempt:
                limit = self._pace()
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
        self._seen(page.records)
        return page

    def _fetch(self) -> Page:
        if self._opener is not None:
            page = self._handed_over_page()
            if page is not None:
                return page
        for attempt in Retrying(**expiry_retry()):
            with attempt:
                if self._iterator is None:
                    self._wait_booked()  # the driver booked the GetShardIterator too
                    self._iterator = self._new_iterator()
                try:
                    return self._paced_page(self._iterator)
                except ClientError as exc:
                    if is_expired(exc):
                        log.info("iterator expired in %s; re-deriving", self._range)
                        self.expiries += 1
                        self._iterator = None
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _get_iterator(self, position: Position) -> str:
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

    def _new_iterator(self) -> str:
        try:
            return self._get_iterator(self._cursor.opening())
        except ClientError as exc:
            if error_code(exc) != INVALID_ARGUMENT:
                raise
            return self._get_iterator(self._cursor.refused())

    def _next_page(self) -> RawPage:
        if self._carried is not None:
            records, self._carried = self._carried, None
            return RawPage(records, carried=True)
        page = self._fetch()
        self._iterator = page.next_iterator
        ended = page.next_iterator is None  # a closed shard's last page
        return RawPage(page.records, shard_ended=ended, at_tip=page.at_tip, behind_ms=page.behind_ms,
                       next_iterator=page.next_iterator)
