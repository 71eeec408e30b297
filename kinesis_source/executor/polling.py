"""Replaying one exact range by polling: ``GetShardIterator`` + ``GetRecords`` pages.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
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
    expiry_retry,
    is_expired,
    missing_shard_or_stream,
)
from kinesis_source.errors import ShardNotFoundError, report_shard_gone
from kinesis_source.executor.cursor import RangeCursor
from kinesis_source.positions import Position, ShardRange

log = logging.getLogger(__name__)


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
        for attempt in Retrying(**expiry_retry()):
            with attempt:
                if self._iterator is None:
                    self._iterator = self._new_iterator()
                try:
                    self.calls += 1
                    resp = self._client.get_records(
                        ShardIterator=self._iterator, Limit=self._limit
                    )
                except ClientError as exc:
                    if is_expired(exc):
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
