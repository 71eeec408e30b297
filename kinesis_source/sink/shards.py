"""Which shard Kinesis routes a hash key to, as the sink last saw the stream.

Open shards' hash key ranges tile the 128-bit space, so the open shard whose range starts at or
below a key's hash holds it. The map paces each shard's writes and groups KPL aggregates by
shard; it can go stale when the stream reshards, which the sink notices when an answer names a
shard other than the one predicted, and then lists the shards again.

The map also keeps closed shards' ranges: an aggregate may land on a shard that closes again
before the sink lists the stream (a second split, a merge, an on-demand stream rescaling), and
its readers still drop the user records outside that shard's range.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

from kinesis_source.aws.kinesis import ShardInfo, list_shards


@dataclass(frozen=True)
class ShardMap:
    """The open shards of one stream by hash key range, and every listed shard's range (small,
    so it travels pickled with the writer to the executors)."""

    starts: tuple[int, ...]
    ends: tuple[int, ...]
    ids: tuple[str, ...]
    # every listed shard, open or closed: shard id -> (first, last) hash key
    ranges: tuple[tuple[str, int, int], ...] = ()

    @staticmethod
    def of(shards: list[ShardInfo]) -> ShardMap:
        """The map of a ``ListShards`` answer's shards."""
        ranges = sorted((s.hash_range, s.shard_id) for s in shards if not s.is_closed and s.hash_range)
        return ShardMap(
            tuple(r[0] for r, _ in ranges), tuple(r[1] for r, _ in ranges), tuple(i for _, i in ranges),
            tuple((s.shard_id, *s.hash_range) for s in shards if s.hash_range),
        )

    @staticmethod
    def load(client: Any, stream: str) -> ShardMap:
        """List ``stream``'s shards (the error names option 'streamName' if it does not exist)."""
        return ShardMap.of(list_shards(client, stream))

    def shard_of(self, hash_key: int) -> str:
        """The shard that takes ``hash_key`` (the first one if the map is empty, which only a
        stream being created has: Kinesis then refuses the write anyway)."""
        return self.ids[max(0, bisect_right(self.starts, hash_key) - 1)] if self.ids else ""

    def holds(self, shard_id: str, hash_key: int) -> bool | None:
        """Whether ``shard_id``'s range (open or closed) holds ``hash_key``; None when the map
        does not know the shard (a child of a reshard since the map was made, or a shard whose
        retention ended): callers must then take the key as not held."""
        for known, first, last in self.ranges:
            if known == shard_id:
                return first <= hash_key <= last
        return None
