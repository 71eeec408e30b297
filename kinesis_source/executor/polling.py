"""Replaying one exact range by polling: ``GetShardIterator`` + ``GetRecords`` pages.
"""

from __future__ import annotations

import logging
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
from kinesis_source.executor.cursor import RangeReaderBase, RawPage
from kinesis_source.positions import Position, ShardRange

log = logging.getLogger(__name__)


class RangeReader(RangeReaderBase):
    """Replays one exact :class:`ShardRange` with a synchronous client, page by page."""

    def __init__(
        self, client: Any, rng: ShardRange, limit: int, fail_on_data_loss: bool = True
    ) -> None:
        super().__init__(rng, fail_on_data_loss)
        self._client = client
        self._limit = limit
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

    def _next_page(self) -> RawPage:
        page = self._fetch()
        self._iterator = page.next_iterator
        ended = page.next_iterator is None  # a closed shard's last page
        return RawPage(page.records, shard_ended=ended, at_tip=page.at_tip)
