"""Where a query starts: option 'initialPosition' resolved per shard.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime

from kinesis_source.aws.kinesis import ShardInfo
from kinesis_source.driver.probe import (
    ProbeResult,
)
from kinesis_source.errors import OptionError
from kinesis_source.options import InitialPosition
from kinesis_source.positions import AFTER, AT, SHARD_END, Position, shard_key

log = logging.getLogger(__name__)


def latest_position(stream: str, shard_id: str, found: ProbeResult, now: datetime) -> Position:
    """``LATEST`` for one shard: after its newest record (TRIM_HORIZON when it has none). A
    shard whose probe only crossed empty pages until the deadline starts at the resolution
    time instead: the records that arrive after it, by the server's arrival timestamps."""
    if found.tip is not None:
        return Position.after(found.tip)
    if found.pending:
        log.warning(
            "Kinesis stream '%s' shard '%s' served only empty pages while LATEST was resolved; "
            "it starts at the records that arrived after %s",
            stream, shard_id, now.isoformat(),
        )
        return Position.at_timestamp(now)
    return Position.trim_horizon()


def initial_for(spec: InitialPosition, stream: str, shard_id: str) -> str:
    if spec.kind == "TRIM_HORIZON":
        return Position.trim_horizon().to_str()
    if spec.kind == "LATEST":
        return "LATEST"
    if spec.kind == "AT_TIMESTAMP":
        assert spec.timestamp is not None
        return Position.at_timestamp(spec.timestamp).to_str()
    named = dict(spec.shards)
    return named.get(shard_key(stream, shard_id), named.get(shard_id, "TRIM_HORIZON"))


def at_progress(wanted: Mapping[tuple[str, str], str]) -> set[str]:
    """Offset keys of the shards whose wanted start is a point in their log (after or at a
    record, or SHARD_END), not a starting point such as TRIM_HORIZON."""
    return {
        shard_key(stream, shard_id)
        for (stream, shard_id), text in wanted.items()
        if text != "LATEST" and Position.parse(text).kind in (AT, AFTER, SHARD_END)
    }


def check_named_shards(spec: InitialPosition, listing: dict[str, list[ShardInfo]]) -> None:
    known = {s.shard_id for shards in listing.values() for s in shards}
    known |= {shard_key(st, s.shard_id) for st, shards in listing.items() for s in shards}
    for key, value in spec.shards:
        if key not in known and value != "SHARD_END":  # an expired, finished shard is fine
            streams = ", ".join(listing)
            raise OptionError(
                f"Option 'initialPosition' names shard '{key}', which stream(s) {streams} do "
                f"not have; known shards: {', '.join(sorted(s for s in known if '/' not in s))}"
            )
    if len(listing) > 1:
        bare = [key for key, _ in spec.shards if "/" not in key]
        if bare:
            raise OptionError(
                f"Option 'initialPosition' names shard '{bare[0]}' without its stream; with "
                "several streams write '<stream>/<shardId>'"
            )
