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


class ShardNotFoundError(KinesisSourceError):
    """The stream exists but no longer has the shard (expired past the stream's retention, or
    its stream was re-created meanwhile): raised by the clients, and turned into a data-loss
    report by :func:`report_shard_gone` where the position being read is known."""

    def __init__(self, stream: str, shard_id: str) -> None:
        super().__init__(f"Kinesis stream '{stream}' has no shard '{shard_id}'")
        self.stream = stream
        self.shard_id = shard_id


def report_shard_gone(stream: str, shard_id: str, position: Position, fail: bool) -> None:
    """A tracked shard is gone while records after ``position`` were still to be read: raise
    :class:`DataLossError` (``failOnDataLoss=true``) or log a warning and go on without it."""
    message = (
        f"Kinesis stream '{stream}' no longer has shard '{shard_id}', which was read only up to "
        f"{position}: its unread records are lost (the shard expired past the stream's "
        "retention, or was deleted)."
    )
    if fail:
        raise DataLossError(f"{message} Set option failOnDataLoss=false to go on without it.")
    log.warning("%s Going on without it (failOnDataLoss=false).", message)


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


def missing_shard_or_stream(client: Any, stream: str, shard_id: str, exc: ClientError) -> Exception:
    """What a ``ResourceNotFoundException`` from a call about one shard means: the shard is
    gone (:class:`ShardNotFoundError`) when the stream still exists, else the stream is missing
    (the error that names option 'streamName'). One ``DescribeStreamSummary`` tells them apart;
    it is made only on this error path."""
    try:
        with stream_must_exist(stream):
            client.describe_stream_summary(StreamName=stream)
    except KinesisSourceError as missing:
        return missing
    return ShardNotFoundError(stream, shard_id)


class RangeCursor:
    """Where the read of one exact range stands; the one template both readers (polling and
    fan-out) follow, so the opening check, the resume position, the cut at the end and the
    incompleteness rule live once.

    Every new iterator or subscription opens at :meth:`opening`: one record *before* the
    position (``AT:s`` for ``AFTER:s``), so :meth:`take` can check that the record is still
    there. A read that landed past it lost records (trimmed by retention): that is reported,
    never skipped silently, whether at the range's start or when resuming after an expiry or a
    subscription's end. The position moves to after each record read, the dropped check record
    included, so a resume never emits a record twice.
    """

    def __init__(self, rng: ShardRange, fail_on_data_loss: bool, mode: str = "") -> None:
        self.range = rng
        self.position = rng.start
        self.last_seq: str | None = None  # the last record read (yielded or dropped as check)
        self._end = seq_key(rng.end_seq)
        self._fail_on_data_loss = fail_on_data_loss
        self._unchecked = False
        self._mode = mode

    def opening(self) -> Position:
        """Where the next iterator or subscription opens; its first records get checked."""
        self._unchecked = True
        return opening_position(self.position)

    def refused(self) -> Position:
        """The server refused :meth:`opening` (the position is older than the retention):
        report the loss, and go on from the oldest record left."""
        self._lost(None)
        self._unchecked = False
        self.position = Position.trim_horizon()
        return self.position

    def take(self, raw: list[dict]) -> tuple[list[dict], bool]:
        """The records of one page (or event) that belong to the range, in order, and whether
        the range is complete with them."""
        records = raw
        if self._unchecked and raw:
            self._unchecked = False
            records, landed = check_opening(raw, self.position)
            if landed is not None:
                self._lost(landed)
        if len(records) < len(raw):  # the check record was dropped: it counts as read
            self._advance(raw[0]["SequenceNumber"])
        out = []
        done = False
        for rec in records:
            if seq_key(rec["SequenceNumber"]) > self._end:
                done = True
                break
            out.append(rec)
        if out:
            self._advance(out[-1]["SequenceNumber"])
            done = done or seq_key(out[-1]["SequenceNumber"]) == self._end
        return out, done

    def _advance(self, seq: str) -> None:
        self.last_seq = seq
        self.position = Position.after(seq)

    def _lost(self, landed: str | None) -> None:
        rng = self.range
        report_data_loss(rng.stream, rng.shard_id, self.position, landed, self._fail_on_data_loss)

    def incomplete(self, shard_ended: bool) -> RangeIncompleteError:
        """The error for reaching the shard's end or tip before the planned end, naming which
        of the causes applies."""
        rng, how = self.range, f" ({self._mode})" if self._mode else ""
        if self.last_seq is None:
            why = (
                "found no record at or after the range's start: every record from there on is "
                "gone (trimmed by the stream's retention), or the stream was deleted and "
                "re-created under the same name"
            )
        elif shard_ended:
            why = (
                f"reached the end of the closed shard (the shard ended) at its last record "
                f"{self.last_seq}, before the planned end: the stream was deleted and re-created under the same name since the batch "
                "was planned, or the offset belongs to another stream"
            )
        else:
            why = (
                f"reached the shard's tip, its newest record being {self.last_seq}, before the "
                "planned end: the stream was deleted and re-created under the same name since the batch was "
                "planned (its sequence numbers restart), or the offset belongs to another stream"
            )
        return RangeIncompleteError(
            f"Cannot complete range {rng}{how}: the read {why}. Spark's checkpoint cannot be "
            "replayed against this stream: run `kinesis-ddb checkpoints reset` and start with "
            "a new checkpointLocation."
        )


class RangeReader:
    """Replays one exact :class:`ShardRange` with a synchronous client, page by page."""

    def __init__(
        self, client: Any, rng: ShardRange, limit: int, fail_on_data_loss: bool = True
    ) -> None:
        self._client = client
        self._range = rng
        self._limit = limit
        self._cursor = RangeCursor(rng, fail_on_data_loss)
        self._fail_on_data_loss = fail_on_data_loss
        self._iterator: str | None = None
        self.calls = 0
        self.expiries = 0

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

    def _get_iterator(self, position: Position) -> str:
        rng = self._range
        self.calls += 1
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

    def pages(self) -> Iterator[list[dict]]:
        """Yield the range's records in order, a page at a time, and nothing past its end."""
        cursor = self._cursor
        while True:
            try:
                page = self._fetch()
            except ShardNotFoundError:
                page = None  # reported outside the handler: no chained traceback for the user
            if page is None:
                rng = self._range
                report_shard_gone(rng.stream, rng.shard_id, cursor.position, self._fail_on_data_loss)
                return
            self._iterator = page.next_iterator
            out, done = cursor.take(page.records)
            if out:
                yield out
            if done:
                return
            # A closed shard's last page, or an empty page at the tip: nothing more will come.
            if page.next_iterator is None or (page.at_tip and not page.records):
                raise cursor.incomplete(shard_ended=page.next_iterator is None)


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
        """A shard iterator at ``position``; :class:`ShardNotFoundError` if the stream no
        longer has the shard."""
        self.calls += 1
        try:
            resp = await self._client.get_shard_iterator(
                StreamName=stream, ShardId=shard_id, **position.iterator_args()
            )
        except ClientError as exc:
            if error_code(exc) != NOT_FOUND:
                raise
            self.calls += 1
            with stream_must_exist(stream):
                await self._client.describe_stream_summary(StreamName=stream)
            raise ShardNotFoundError(stream, shard_id) from exc
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

