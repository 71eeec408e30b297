"""What DynamoDB holds for an application, and waiting for it."""

from __future__ import annotations

from kinesis_source.checkpoints.store import CheckpointStore
from kinesis_source.positions import Position, ShardId, seq_key
from tests.support.waiting import wait_for

TABLE = "kinesis_ddb_checkpoints"


def stored(ddb, app) -> dict[ShardId, Position]:
    """The committed positions of an application."""
    return CheckpointStore(ddb, TABLE, app).snapshot().positions()


def tips(sent) -> dict[str, Position]:
    """Per shard, the position after the newest record sent."""
    last: dict[str, str] = {}
    for p in sent:
        if p.shard_id not in last or seq_key(p.seq) > seq_key(last[p.shard_id]):
            last[p.shard_id] = p.seq
    return {sh: Position.after(seq) for sh, seq in last.items()}


def wait_committed(ddb, app, stream, sent, timeout=60):
    """Wait until DynamoDB holds, for every shard written, the position after its newest record."""
    want = {ShardId(stream, sh): pos for sh, pos in tips(sent).items()}
    wait_for(
        lambda: {k: v for k, v in stored(ddb, app).items() if k in want} == want,
        timeout=timeout,
        what=f"DynamoDB to hold {want}",
    )
