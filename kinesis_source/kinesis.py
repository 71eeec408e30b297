"""Narrow clients over the Kinesis API: shard listing, iterators, pages of records.

Shard iterators never leave this module: callers speak in positions and ranges. The driver uses
the async :class:`AsyncKinesis` (probes of all shards run concurrently); executors replay one
exact range with :class:`RangeReader` over a synchronous boto3 client.

Throttling, 5xx and network errors are retried by botocore's standard retry mode (see
``aws.py``); tenacity handles only what botocore cannot: an expired iterator is re-derived from
the last sequence number read.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterator

from botocore.exceptions import ClientError
from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
)

from .positions import AFTER, AT, Position, ShardRange, seq_key

log = logging.getLogger(__name__)

EXPIRED_ITERATOR = "ExpiredIteratorException"
NOT_FOUND = "ResourceNotFoundException"
# An expired iterator is re-derived at once; more than a few in a row means something else.
_EXPIRY_ATTEMPTS = 5


class KinesisSourceError(RuntimeError):
    """An error the user can act on; the message names the stream and shard."""


class RangeIncompleteError(KinesisSourceError):
    """A planned range could not be read to its end."""


class DataLossError(KinesisSourceError):
    """Records after a position are gone (trimmed by retention, or the shard deleted)."""


INVALID_ARGUMENT = "InvalidArgumentException"


def opening_position(start: Position) -> Position:
    """Where to open an iterator to read after ``start`` *and* see that its record is still
    there: ``AFTER:s`` opens at ``AT:s`` (one extra record), so a trimmed ``s`` shows."""
    if start.kind == AFTER:
        return Position.at(start.seq)  # type: ignore[arg-type]
    return start


def check_opening(records: list[dict], start: Position) -> tuple[list[dict], str | None]:
    """The records of the first page after ``start`` (read from :func:`opening_position`),
    and, if ``start``'s record is gone, the sequence number the read landed on instead."""
    if start.kind not in (AT, AFTER) or not records:
        return records, None
    first = records[0]["SequenceNumber"]
    if first != start.seq:
        return records, first  # landed past the position: its record was trimmed
    if start.kind == AFTER and start.sub_seq is None:
        return records[1:], None
    return records, None


def report_data_loss(
    stream: str, shard_id: str, start: Position, landed: str | None, fail: bool
) -> None:
    """Records after ``start`` are gone: raise :class:`DataLossError` (``failOnDataLoss=true``)
    or log a warning and go on. The message names stream, shard, position and remedy."""
    where = f"the oldest record left is {landed}" if landed else "the position was rejected"
    message = (
        f"Records of Kinesis stream '{stream}' shard '{shard_id}' after position {start} are no "
        f"longer in the stream (older than its retention period, or trimmed): {where}. Set "
        "option failOnDataLoss=false to go on from the oldest record left, or move the "
        "application with `kinesis-ddb checkpoints reset`."
    )
    if fail:
        raise DataLossError(message)
    log.warning("%s Going on (failOnDataLoss=false).", message)


def error_code(exc: BaseException) -> str | None:
    """The AWS error code of a botocore ``ClientError``, else None."""
    if isinstance(exc, ClientError):
        return exc.response.get("Error", {}).get("Code")
    return None


def _is_expired(exc: BaseException) -> bool:
    return error_code(exc) == EXPIRED_ITERATOR


def _expiry_retry() -> dict[str, Any]:
    return {
        "retry": retry_if_exception(_is_expired),
        "stop": stop_after_attempt(_EXPIRY_ATTEMPTS),
        "reraise": True,
    }


def arrival_seconds(record: dict) -> float:
    """A record's ApproximateArrivalTimestamp as epoch seconds."""
    ts = record["ApproximateArrivalTimestamp"]
    return ts.timestamp() if isinstance(ts, datetime) else float(ts)


@dataclass(frozen=True)
class ShardInfo:
    """One shard as listed by ``ListShards``."""

    shard_id: str
    parent: str | None = None
    adjacent_parent: str | None = None
    starting_seq: str | None = None
    ending_seq: str | None = None  # set once the shard is closed
    # (first, last) hash key, inclusive; KPL aggregates may hold user records outside it
    hash_range: tuple[int, int] | None = None

    @property
    def is_closed(self) -> bool:
        """True when the shard takes no more writes."""
        return self.ending_seq is not None

    @staticmethod
    def from_api(raw: dict) -> "ShardInfo":
        """Build from one element of ``ListShards``' ``Shards``."""
        seqs = raw.get("SequenceNumberRange", {})
        hashes = raw.get("HashKeyRange")
        return ShardInfo(
            shard_id=raw["ShardId"],
            parent=raw.get("ParentShardId"),
            adjacent_parent=raw.get("AdjacentParentShardId"),
            starting_seq=seqs.get("StartingSequenceNumber"),
            ending_seq=seqs.get("EndingSequenceNumber"),
            hash_range=(
                (int(hashes["StartingHashKey"]), int(hashes["EndingHashKey"])) if hashes else None
            ),
        )


@dataclass
class Page:
    """One ``GetRecords`` response."""

    records: list[dict]
    next_iterator: str | None
    behind_ms: int

    @property
    def at_tip(self) -> bool:
        """True when the shard ended, or ``MillisBehindLatest`` said nothing newer was there
        when the page was served. Real Kinesis reports it in whole milliseconds, so a page can
        say 0 with records of the same millisecond still after it: see :meth:`caught_up`."""
        return self.next_iterator is None or self.behind_ms == 0

    def caught_up(self, limit: int) -> bool:
        """True when the reader has reached the tip: the shard ended, or the page is at the tip
        and held fewer records than asked for (so none were left behind it)."""
        return self.next_iterator is None or (self.behind_ms == 0 and len(self.records) < limit)

    @staticmethod
    def from_api(resp: dict) -> "Page":
        """Build from a ``GetRecords`` response."""
        return Page(
            records=resp.get("Records", []),
            next_iterator=resp.get("NextShardIterator"),
            behind_ms=int(resp.get("MillisBehindLatest") or 0),
        )


@contextmanager
def stream_must_exist(stream: str) -> Iterator[None]:
    """Turn ``ResourceNotFoundException`` into an error that says which option to check."""
    try:
        yield
    except ClientError as exc:
        if error_code(exc) == NOT_FOUND:
            raise KinesisSourceError(
                f"Kinesis stream '{stream}' was not found ({exc}); check option 'streamName' "
                "and option 'region'/'endpointUrl'"
            ) from exc
        raise


class RangeReader:
    """Replays one exact :class:`ShardRange` with a synchronous client, page by page."""

    def __init__(
        self, client: Any, rng: ShardRange, limit: int, fail_on_data_loss: bool = True
    ) -> None:
        self._client = client
        self._range = rng
        self._limit = limit
        self._fail_on_data_loss = fail_on_data_loss
        self._iterator: str | None = None
        self._last_seq: str | None = None
        self._opened = False
        self.calls = 0
        self.expiries = 0

    def _resume_position(self) -> Position:
        if self._last_seq is None:
            return opening_position(self._range.start)
        return Position.after(self._last_seq)

    def _lost(self, landed: str | None) -> None:
        rng = self._range
        report_data_loss(rng.stream, rng.shard_id, rng.start, landed, self._fail_on_data_loss)

    def _fetch(self) -> Page:
        for attempt in Retrying(**_expiry_retry()):
            with attempt:
                if self._iterator is None:
                    self._iterator = self._new_iterator()
                try:
                    self.calls += 1
                    resp = self._client.get_records(
                        ShardIterator=self._iterator, Limit=self._limit
                    )
                except ClientError as exc:
                    if _is_expired(exc):
                        log.info("iterator expired in %s; re-deriving", self._range)
                        self.expiries += 1
                        self._iterator = None
                    raise
        return Page.from_api(resp)

    def _new_iterator(self) -> str:
        rng = self._range
        self.calls += 1
        try:
            with stream_must_exist(rng.stream):
                resp = self._client.get_shard_iterator(
                    StreamName=rng.stream,
                    ShardId=rng.shard_id,
                    **self._resume_position().iterator_args(),
                )
        except ClientError as exc:
            if error_code(exc) == INVALID_ARGUMENT and self._last_seq is None:
                self._lost(None)  # the start position itself was refused
                self.calls += 1
                resp = self._client.get_shard_iterator(
                    StreamName=rng.stream, ShardId=rng.shard_id, ShardIteratorType="TRIM_HORIZON"
                )
                self._opened = True
                return resp["ShardIterator"]
            raise
        return resp["ShardIterator"]

    def pages(self) -> Iterator[list[dict]]:
        """Yield the range's records in order, a page at a time, and nothing past its end."""
        rng = self._range
        end = seq_key(rng.end_seq)
        while True:
            page = self._fetch()
            self._iterator = page.next_iterator
            if not self._opened and page.records:
                self._opened = True
                page.records, landed = check_opening(page.records, rng.start)
                if landed is not None:
                    self._lost(landed)
            out = []
            done = False
            for rec in page.records:
                if seq_key(rec["SequenceNumber"]) > end:
                    done = True
                    break
                out.append(rec)
            if out:
                self._last_seq = out[-1]["SequenceNumber"]
                if seq_key(self._last_seq) == end:
                    done = True
                yield out
            if done:
                return
            if page.at_tip and not page.records:
                reached = self._last_seq or "nothing"
                why = "the shard ended" if page.next_iterator is None else "the shard's tip"
                raise RangeIncompleteError(
                    f"Cannot complete range {rng}: read up to {reached} and reached {why} "
                    f"before the planned end {rng.end_seq}. The records may have been trimmed "
                    "by the stream's retention, or the stream was re-created under the same name."
                )


class AsyncKinesis:
    """The driver's async Kinesis calls, with call and record counters for the probe cost."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.calls = 0
        self.records_fetched = 0

    async def list_shards(self, stream: str) -> list[ShardInfo]:
        """Every shard of ``stream`` (open and closed), following pagination."""
        shards: list[ShardInfo] = []
        kwargs: dict[str, Any] = {"StreamName": stream}
        while True:
            self.calls += 1
            with stream_must_exist(stream):
                resp = await self._client.list_shards(**kwargs)
            shards.extend(ShardInfo.from_api(s) for s in resp.get("Shards", []))
            token = resp.get("NextToken")
            if not token:
                return shards
            kwargs = {"NextToken": token}

    async def creation_time(self, stream: str) -> str:
        """The stream's creation time (ISO-8601), from ``DescribeStreamSummary``."""
        self.calls += 1
        with stream_must_exist(stream):
            resp = await self._client.describe_stream_summary(StreamName=stream)
        created = resp["StreamDescriptionSummary"]["StreamCreationTimestamp"]
        if not isinstance(created, datetime):
            created = datetime.fromtimestamp(float(created), tz=timezone.utc)
        return created.astimezone(timezone.utc).isoformat(timespec="milliseconds")

    async def iterator(self, stream: str, shard_id: str, position: Position) -> str:
        """A shard iterator at ``position``."""
        self.calls += 1
        with stream_must_exist(stream):
            resp = await self._client.get_shard_iterator(
                StreamName=stream, ShardId=shard_id, **position.iterator_args()
            )
        return resp["ShardIterator"]

    async def page(self, iterator: str, limit: int) -> Page:
        """One ``GetRecords`` call."""
        self.calls += 1
        resp = await self._client.get_records(ShardIterator=iterator, Limit=limit)
        page = Page.from_api(resp)
        self.records_fetched += len(page.records)
        return page

    async def page_at(
        self, stream: str, shard_id: str, position: Position, limit: int, iterator: str | None
    ) -> Page:
        """One page starting at ``position``; ``iterator`` (if given) is a cached iterator at
        that position, replaced by a fresh one if it expired."""
        current = {"it": iterator}
        async for attempt in AsyncRetrying(**_expiry_retry()):
            with attempt:
                if current["it"] is None:
                    current["it"] = await self.iterator(stream, shard_id, position)
                try:
                    return await self.page(current["it"], limit)
                except ClientError as exc:
                    if _is_expired(exc):
                        current["it"] = None
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def close(self) -> None:
        """Close the underlying client."""
        await self._client.__aexit__(None, None, None)

