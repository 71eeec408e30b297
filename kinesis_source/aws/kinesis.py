"""The narrow Kinesis API both sides use: shard listings, pages of records, error codes, and
the driver's async client.

Throttling, 5xx and network errors are retried by botocore's standard retry mode (see
``clients.py``); tenacity handles only what botocore cannot: an expired iterator is
re-derived (:func:`expiry_retry`), and a reader's throttled ``GetRecords`` is tried again when
the shard's byte model says, not after a backoff guess (:func:`throttle_retry`). Shard
iterators never leave the readers and the probe: callers speak in positions and ranges.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
)

from kinesis_source.aws.clients import error_code
from kinesis_source.aws.retries import is_connect_error
from kinesis_source.aws.streams import arn_arg
from kinesis_source.errors import NO_CREDENTIALS, KinesisSourceError, ShardNotFoundError, StreamNotFoundError
from kinesis_source.positions import Position

log = logging.getLogger(__name__)


EXPIRED_ITERATOR = "ExpiredIteratorException"
# Iterators live 5 minutes. One handed to an executor (a probe's opener, a carried run's) must
# outlive the batch's planning and its task's start: an older one is not handed out, and the
# read's GetShardIterator is booked instead of being made, unbooked, after the expiry.
HANDED_ITERATOR_TTL_S = 120.0
# Kinesis counts a call when it arrives, the driver's windows when it is sent: two calls sent a
# whole window apart can arrive less than that apart (a slow first send; a probe and an executor
# read booked beside it, in two processes). The windows keep this much more between calls.
ARRIVAL_MARGIN_S = 0.05

_receipt = threading.local()


def note_receipts(client: Any) -> None:
    """Have a synchronous ``client`` note, per thread, when each ``GetRecords`` answer arrived,
    before botocore parses it (:func:`received_at`). Parsing a 10 MB page takes a fifth of a
    second or more, and a shard's byte bucket starts refilling when the answer left Kinesis:
    a read's model that counted from the end of parsing would believe the shard has less than
    it has, for the rest of the read."""
    client.meta.events.register("before-parse.kinesis.GetRecords", _note_receipt, unique_id="kinesis-ddb-receipt")


def _note_receipt(**_: Any) -> None:
    _receipt.at = time.time()


def received_at(default: float) -> float:
    """When this thread's last ``GetRecords`` answer arrived (epoch seconds; never after
    ``default``, the caller's now), forgotten once read; ``default`` when it was not noted (a
    client without :func:`note_receipts`)."""
    at, _receipt.at = getattr(_receipt, "at", None), None
    return default if at is None else min(at, default)


NOT_FOUND = "ResourceNotFoundException"


INVALID_ARGUMENT = "InvalidArgumentException"
IN_USE = "ResourceInUseException"
LIMIT_EXCEEDED = "LimitExceededException"
THROTTLED = "ProvisionedThroughputExceededException"


# An expired iterator is re-derived at once; more than a few in a row means something else.
_EXPIRY_ATTEMPTS = 5


def is_expired(exc: BaseException) -> bool:
    return error_code(exc) == EXPIRED_ITERATOR


def is_throttled(exc: BaseException) -> bool:
    """True for a call refused for throughput (the shard's calls or bytes were spent)."""
    return error_code(exc) == THROTTLED


def throttle_retry(attempts: int) -> dict[str, Any]:
    """tenacity settings for a reader's ``GetRecords`` that its client hands back when throttled
    (``AwsSettings.pacing_reads``): retried at once, because each attempt first waits for the
    shard's byte model (``read_rate.py``), which the refusal has just set to empty."""
    return {
        "retry": retry_if_exception(is_throttled),
        "stop": stop_after_attempt(attempts),
        "reraise": True,
    }


def expiry_retry() -> dict[str, Any]:
    return {
        "retry": retry_if_exception(is_expired),
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
    def from_api(raw: dict) -> ShardInfo:
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
    # the Limit the call was made with, when the byte budget lowered the caller's
    asked: int | None = None

    @property
    def at_tip(self) -> bool:
        """True when the shard ended, or ``MillisBehindLatest`` said nothing newer was there
        when the page was served. Real Kinesis reports it in whole milliseconds, so a page can
        say 0 with records of the same millisecond still after it: see :meth:`caught_up`."""
        return self.next_iterator is None or self.behind_ms == 0

    def caught_up(self, limit: int) -> bool:
        """True when the reader has reached the tip: the shard ended, or the page is at the tip
        and held fewer records than asked for (so none were left behind it)."""
        asked = limit if self.asked is None else min(limit, self.asked)
        return self.next_iterator is None or (self.behind_ms == 0 and len(self.records) < asked)

    @staticmethod
    def from_api(resp: dict) -> Page:
        """Build from a ``GetRecords`` response."""
        return Page(
            records=resp.get("Records", []),
            next_iterator=resp.get("NextShardIterator"),
            behind_ms=int(resp.get("MillisBehindLatest") or 0),
        )


@contextmanager
def stream_must_exist(stream: str) -> Iterator[None]:
    """Turn ``ResourceNotFoundException``, and an endpoint that cannot be reached, into errors
    that say which option to check. The original error is in the message, not chained: the
    user sees one traceback, with this message on its last line."""
    try:
        yield
    except ClientError as exc:
        if error_code(exc) == NOT_FOUND:
            raise StreamNotFoundError(
                f"Kinesis stream '{stream}' was not found: check option 'streamName' (or 'streamARN') "
                f"(and 'region'/'endpointUrl' if the stream is elsewhere). AWS said: {exc}"
            ) from None
        raise
    except BotoCoreError as exc:
        if isinstance(exc, NoCredentialsError):
            raise KinesisSourceError(
                f"No AWS credentials for Kinesis stream '{stream}': {NO_CREDENTIALS}"
            ) from None
        if is_connect_error(exc):
            raise KinesisSourceError(
                f"Could not connect to Kinesis for stream '{stream}': check option "
                f"'endpointUrl' (or 'region' when no endpoint is set). {exc}"
            ) from None
        raise


KMS_ERRORS = {
    "KMSAccessDeniedException": "these credentials may not use the stream's KMS key ({action})",
    "KMSDisabledException": "the stream's KMS key is disabled",
    "KMSNotFoundException": "the stream's KMS key was not found (deleted, or in another region)",
    "KMSInvalidStateException": "the stream's KMS key is not usable in its state",
    "KMSOptInRequired": "the account has not opted in to KMS",
}


def readable_error(exc: ClientError, stream: str, shard_id: str) -> KinesisSourceError | None:
    """The error a read of a shard gets, worded for the user where AWS' code says more than its
    message (the stream's KMS key), whether it came from a call or inside an event stream;
    None for the others (they stay as they are)."""
    why = KMS_ERRORS.get(error_code(exc) or "")
    if why is None:
        return None
    return KinesisSourceError(
        f"Cannot read shard {shard_id} of stream '{stream}': {why.format(action='kms:Decrypt')}. The "
        f"stream is encrypted with a KMS key its readers need kms:Decrypt on (see docs/operations.md, "
        f"Minimal IAM policy). AWS said: {exc}"
    )


def unwritable_error(exc: ClientError, stream: str) -> KinesisSourceError | None:
    """The error a write to ``stream`` gets where AWS' code says more than its message (the
    stream's KMS key, a missing permission); None for the others."""
    code = error_code(exc) or ""
    if code == "AccessDeniedException":
        why = "these credentials may not call PutRecords on it (IAM action kinesis:PutRecords)"
    elif code in KMS_ERRORS:
        why = (
            f"{KMS_ERRORS[code].format(action='kms:GenerateDataKey')}; a stream encrypted with a "
            "KMS key needs kms:GenerateDataKey on it from its writers"
        )
    else:
        return None
    return KinesisSourceError(
        f"Cannot write to Kinesis stream '{stream}': {why} (see docs/sink.md, AWS calls and IAM). "
        f"AWS said: {exc}"
    )


def missing_shard_or_stream(client: Any, stream: str, shard_id: str, exc: ClientError) -> Exception:
    """What a ``ResourceNotFoundException`` from a call about one shard means: the shard is
    gone (:class:`ShardNotFoundError`) when the stream still exists, else the stream is missing
    (the error that names option 'streamName'). One ``DescribeStreamSummary`` tells them apart;
    it is made only on this error path."""
    try:
        with stream_must_exist(stream):
            client.describe_stream_summary(StreamName=stream)
    except StreamNotFoundError as missing:
        return missing
    return ShardNotFoundError(stream, shard_id)


def created_at(summary: dict) -> datetime:
    """A stream's creation time (UTC) from a ``DescribeStreamSummary`` response."""
    created = summary["StreamDescriptionSummary"]["StreamCreationTimestamp"]
    if not isinstance(created, datetime):
        created = datetime.fromtimestamp(float(created), tz=timezone.utc)
    return created.astimezone(timezone.utc)


def list_shards(client: Any, stream: str) -> list[ShardInfo]:
    """Every shard of ``stream`` with a boto3 client (the commands; the driver lists with
    :class:`AsyncKinesis`)."""
    with stream_must_exist(stream):
        pages = client.get_paginator("list_shards").paginate(StreamName=stream)
        return [ShardInfo.from_api(s) for page in pages for s in page.get("Shards", [])]


class AsyncKinesis:
    """The driver's async Kinesis calls, with call and record counters for the probe cost."""

    def __init__(self, client: Any, arns: Mapping[str, str] | None = None) -> None:
        """``arns``: stream name -> ARN of the streams given by ARN (``GetRecords`` passes it)."""
        self._client = client
        self._arns = dict(arns or {})
        self.calls = 0
        self.records_fetched = 0

    @property
    def client(self) -> Any:
        """The aiobotocore client underneath (benchmarks attach call meters to its events)."""
        return self._client

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
        return created_at(resp).isoformat(timespec="milliseconds")

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

    async def page(self, stream: str, shard_id: str, iterator: str, limit: int) -> Page:
        """One ``GetRecords`` call on ``iterator``, which reads shard ``shard_id`` of ``stream``
        (every call names its shard: the paced client spends that shard's budgets, and a
        stream given by ARN is named by it)."""
        self.calls += 1
        resp = await self._client.get_records(ShardIterator=iterator, Limit=limit, **arn_arg(self._arns, stream))
        page = Page.from_api(resp)
        self.records_fetched += len(page.records)
        return page

    async def page_at(
        self, stream: str, shard_id: str, position: Position, limit: int, iterator: str | None
    ) -> Page:
        """One page starting at ``position``; ``iterator`` (if given) is a cached iterator at
        that position, replaced by a fresh one if it expired."""
        current: dict[str, str | None] = {"it": iterator}
        async for attempt in AsyncRetrying(**expiry_retry()):
            with attempt:
                it = current["it"]
                if it is None:
                    it = current["it"] = await self.iterator(stream, shard_id, position)
                try:
                    return await self.page(stream, shard_id, it, limit)
                except ClientError as exc:
                    if is_expired(exc):
                        current["it"] = None
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def ready(self, key: Any, ops: tuple[str, ...]) -> None:
        """Wait until calls of ``ops`` on shard ``key`` may be made at once (nothing to wait
        for here; see the driver's paced client, whose budgets are per shard)."""

    def forget(self, key: Any) -> None:
        """Drop what is kept for a shard that left the query (nothing here; see the driver's
        paced client)."""

    async def close(self) -> None:
        """Close the underlying client."""
        await self._client.__aexit__(None, None, None)
