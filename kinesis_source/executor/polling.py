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
import time
from typing import Any

from botocore.exceptions import ClientError
from tenacity import (
    Retrying,
)

from kinesis_source.aws.clients import error_code
from kinesis_source.aws.kinesis import (
    INVALID_ARGUMENT,
    Page,
    arrival_seconds,
    expiry_retry,
    is_expired,
)
from kinesis_source.executor.cursor import RangeReaderBase, RawPage
from kinesis_source.executor.gate import ShardGate
from kinesis_source.positions import AFTER, ShardRange, seq_key
from kinesis_source.read_rate import (
    MIN_RATE_SPAN_S,
    RateState,
    ShardBytes,
    records_between,
)

log = logging.getLogger(__name__)

# A range that holds more records than planning estimated is read on in calls for at least this
# share of the estimate.
FOLLOW_UP_SHARE = 0.25


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
        self._gate = ShardGate(client, rng, page_interval_s, not_before, rate, max_rate, attempts, stream_arn,
                               held_interval_s, second_at, retried, records)
        self._limit = limit
        self._records = records
        self._iterator: str | None = None
        self._opener = opener
        self.expiries = 0
        self.handed_over = False  # the driver's iterator served the first page
        self._end_at = end_at
        # (a record's arrival, records received up to it): the first record and each page's last
        self._marks: list[tuple[float, int]] = []
        # records arrive in bunches (a PutRecords' records share one arrival): how many of the
        # last records read share the last one's arrival, and the most seen sharing one
        self._bunch = 0
        self._widest = 0
        self._carried: list[dict] | None = list(carried) if carried else None

    @property
    def calls(self) -> int:
        """Kinesis calls made."""
        return self._gate.calls

    @property
    def call_times(self) -> dict[str, list[float]]:
        """The calls made, by operation, with their times (epoch seconds)."""
        return self._gate.call_times

    @property
    def bytes(self) -> ShardBytes:
        """The shard's byte model, as this read keeps it."""
        return self._gate.bytes

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

    def _reported_calls(self) -> dict[str, list[float]]:
        return self._gate.reported_calls()

    def _rate_state(self) -> RateState | None:
        return self.bytes.state(time.time())

    def _throttled(self) -> int:
        return self.bytes.throttles

    def _paced_page(self, iterator: str) -> Page:
        """One ``GetRecords`` through the gate, sized to what the range still holds."""
        records = self._page_limit()
        rest = max(0, self._records - self._cursor.read) if self._records is not None else None
        page = self._gate.page(iterator, records, self._left(records), rest)
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

    def _new_iterator(self) -> str:
        try:
            return self._gate.iterator(self._cursor.opening())
        except ClientError as exc:
            if error_code(exc) != INVALID_ARGUMENT:
                raise
            return self._gate.iterator(self._cursor.refused())

    def _next_page(self) -> RawPage:
        if self._carried is not None:
            records, self._carried = self._carried, None
            return RawPage(records, carried=True)
        page = self._fetch()
        self._iterator = page.next_iterator
        ended = page.next_iterator is None  # a closed shard's last page
        return RawPage(page.records, shard_ended=ended, at_tip=page.at_tip, behind_ms=page.behind_ms,
                       next_iterator=page.next_iterator)
