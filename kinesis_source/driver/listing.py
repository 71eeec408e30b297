"""The shard listing of the query's streams, and discovery of new shards in the background."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from kinesis_source.aws.kinesis import AsyncKinesis, ShardInfo
from kinesis_source.errors import StreamNotFoundError
from kinesis_source.options import SourceOptions
from kinesis_source.positions import ShardId

log = logging.getLogger(__name__)

# Shard discovery never runs more often than this, whatever shardDiscoveryIntervalMs says.
MIN_DISCOVERY_INTERVAL_S = 1.0


class ShardListing:
    """Every shard of each stream as ``ListShards`` last said, refreshed every
    ``shardDiscoveryIntervalMs`` by :meth:`discover` and at once after :meth:`stale`.

    ``shards`` is replaced by a new object only when the listing changed, so that planning can
    tell a new listing by identity."""

    def __init__(self, opts: SourceOptions, client: Callable[[], Awaitable[AsyncKinesis]]) -> None:
        self._opts = opts
        self._client = client
        self.shards: dict[str, list[ShardInfo]] = {}
        self._listed_at = float("-inf")
        self._stale = False

    def stale(self) -> None:
        """A shard closed or went away: its children, or its absence, come with the next list."""
        self._stale = True

    async def get(self, force: bool = False) -> dict[str, list[ShardInfo]]:
        """The listing; listed now if forced, marked stale, or never listed."""
        if force or self._stale or not self.shards:
            self._stale = False
            k = await self._client()
            lists = await asyncio.gather(*(self._list(k, s) for s in self._opts.stream_names))
            shards = dict(zip(self._opts.stream_names, lists, strict=True))
            if shards != self.shards:
                self.shards = shards  # a new object only when it changed: planning keys on it
            self._listed_at = time.monotonic()
        return self.shards

    def current(self) -> dict[str, list[ShardInfo]] | None:
        """The listing, or None when :meth:`get` would list now (stale, or never listed)."""
        return None if self._stale or not self.shards else self.shards

    async def discover(self) -> None:
        """List every ``shardDiscoveryIntervalMs``, off the batch path (until cancelled)."""
        interval = max(self._opts.shard_discovery_interval_ms / 1000, MIN_DISCOVERY_INTERVAL_S)
        while True:
            await asyncio.sleep(max(0.0, self._listed_at + interval - time.monotonic()))
            if time.monotonic() - self._listed_at >= interval:
                await self.get(force=True)

    async def _list(self, k: AsyncKinesis, stream: str) -> list[ShardInfo]:
        try:
            return await k.list_shards(stream)
        except StreamNotFoundError:
            if self._opts.fail_on_data_loss:
                raise
            log.warning(
                "Kinesis stream '%s' was not found; reading none of it until it exists "
                "(failOnDataLoss=false)", stream
            )
            return []

    async def identities(self) -> dict[str, str]:
        """Each stream's creation time (``DescribeStreamSummary``)."""
        k = await self._client()
        streams = self._opts.stream_names
        created = await asyncio.gather(*(k.creation_time(s) for s in streams))
        return dict(zip(streams, created, strict=True))

    def ids(self) -> set[ShardId]:
        """Every listed shard."""
        return {ShardId(st, s.shard_id) for st, shards in self.shards.items() for s in shards}

    def hash_ranges(self) -> dict[ShardId, tuple[int, int] | None]:
        """Each listed shard's (first, last) hash key; None where the listing gave no range."""
        return {ShardId(st, s.shard_id): s.hash_range for st, shards in self.shards.items() for s in shards}

    def entering(self, streams: frozenset[str]) -> list[str]:
        """The query's streams that have shards but none among ``streams``."""
        return [s for s in self._opts.stream_names if self.shards.get(s) and s not in streams]

    def view(self) -> Mapping[str, list[ShardInfo]]:
        """The listing as last fetched (empty before the first)."""
        return self.shards
