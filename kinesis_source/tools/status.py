"""``kinesis-ddb status``: where an application stands, shard by shard, like
``kafka-consumer-groups --describe``.

For every shard of the application's streams (committed in DynamoDB, or listed by Kinesis): the
committed position and when it was committed, whether the shard is open, closed (ended, not yet
read to its end), finished (read to its end), gone (past the stream's retention) or not started,
and how far the application is behind its tip. The lag costs, per shard not finished, one
``GetShardIterator`` at the committed position and one ``GetRecords`` of at most
``max_records`` records: the records it returns are counted (exactly when the page reached the
tip, else "at least"), and its ``MillisBehindLatest`` is the lag in time. Per stream, one
``ListShards``. Nothing is written.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any, TextIO

from kinesis_source.aws.kinesis import ShardInfo, list_shards
from kinesis_source.aws.streams import arn_arg
from kinesis_source.checkpoints.format import Snapshot
from kinesis_source.errors import StreamNotFoundError
from kinesis_source.positions import AFTER, Position, ShardId, seq_key

OPEN, CLOSED, FINISHED, GONE, NOT_STARTED = "open", "closed", "finished", "gone", "not started"


@dataclass(frozen=True)
class ShardStatus:
    """One shard's line."""

    stream: str
    shard: str
    position: str | None  # committed, canonical text; None when nothing was committed
    committed_at: str | None
    state: str
    behind_records: int | None = None
    behind_exact: bool = False  # behind_records counts every record after the position
    behind_ms: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``--json``)."""
        return asdict(self)


def shard_state(info: ShardInfo | None, position: Position | None) -> str:
    """A shard's state from its listing (None: not listed) and its committed position."""
    if info is None:
        return GONE
    if position is None:
        return NOT_STARTED
    if position.is_shard_end or (
        info.ending_seq is not None and position.kind == AFTER and position.seq is not None
        and seq_key(position.seq) >= seq_key(info.ending_seq)
    ):
        return FINISHED
    return CLOSED if info.is_closed else OPEN


def _lag(
    client: Any, key: ShardId, position: Position, max_records: int, arns: Mapping[str, str]
) -> tuple[int, bool, int]:
    it = client.get_shard_iterator(
        StreamName=key.stream, ShardId=key.shard, **position.iterator_args()
    )["ShardIterator"]
    page = client.get_records(ShardIterator=it, Limit=max_records, **arn_arg(arns, key.stream))
    records = len(page.get("Records", []))
    behind_ms = int(page.get("MillisBehindLatest") or 0)
    at_tip = page.get("NextShardIterator") is None or behind_ms == 0
    return records, at_tip and records < max_records, behind_ms


def collect(
    snapshot: Snapshot, client: Any, max_records: int, streams: Iterable[str] = (),
    arns: Mapping[str, str] | None = None,
) -> list[ShardStatus]:
    """Every shard's status (``client``: boto3 Kinesis, naming the streams of ``arns`` by ARN),
    sorted by stream and shard."""
    committed = snapshot.shards
    names = set(streams) | {k.stream for k in committed}
    if snapshot.meta is not None:
        names |= set(snapshot.meta.streams)
    listing: dict[str, Mapping[str, ShardInfo]] = {}
    for stream in sorted(names):
        try:
            listing[stream] = {s.shard_id: s for s in list_shards(client, stream)}
        except StreamNotFoundError:  # deleted since: its committed shards are gone
            listing[stream] = {}
    keys = set(committed) | {ShardId(st, sh) for st, shards in listing.items() for sh in shards}
    out = []
    for key in sorted(keys, key=str):
        stored = committed.get(key)
        position = stored.position if stored else None
        state = shard_state(listing.get(key.stream, {}).get(key.shard), position)
        lag: tuple[int | None, bool, int | None] = (None, False, None)
        if position is not None and state in (OPEN, CLOSED):
            lag = _lag(client, key, position, max_records, arns or {})
        elif state == FINISHED:
            lag = (0, True, 0)
        out.append(ShardStatus(key.stream, key.shard, position.to_str() if position else None,
                               stored.committed_at if stored else None, state, *lag))
    return out


def behind_text(status: ShardStatus) -> str:
    """The lag column: ``12 records, 3400 ms``; ``>= 10000`` when the page was full."""
    if status.behind_records is None:
        return "-"
    count = f"{status.behind_records}" if status.behind_exact else f">= {status.behind_records}"
    return f"{count} records, {status.behind_ms} ms"


def render(shards: list[ShardStatus], out: TextIO, writes: Snapshot | None = None) -> None:
    """The status as a table, then what the last commits cost (from ``writes``'s log)."""
    now = datetime.now(timezone.utc)
    rows = [["shard", "state", "committed position", "age", "behind the tip"]]
    for s in shards:
        rows.append([str(ShardId(s.stream, s.shard)), s.state, s.position or "-",
                     age(s.committed_at, now), behind_text(s)])
    table(rows, out)
    if writes is not None:
        out.writelines(f"{line}\n" for line in write_units_text(writes, now))


def write_units_text(snapshot: Snapshot, now: datetime) -> list[str]:
    """The DynamoDB write units of the last commits and compaction, as their writer sized
    the items (format 4 keeps them in the log)."""
    lines = []
    commits = [e for e in snapshot.log if e.write_units][-10:]
    if commits:
        units = [e.write_units for e in commits]
        moved = sorted(len(e.positions) for e in commits)[len(commits) // 2]
        lines.append(
            f"DynamoDB write units of the last {len(commits)} commit(s), oldest first: "
            f"{', '.join(map(str, units))} (median {sorted(units)[len(units) // 2]}, "
            f"{moved} shard(s) moved per commit; last {age(commits[-1].committed_at, now)} ago)"
        )
    meta = snapshot.meta
    if meta is not None and meta.compacted_at:
        lines.append(
            f"last compaction of the commit log: {meta.compacted_write_units} write units, "
            f"{age(meta.compacted_at, now)} ago"
        )
    return lines


def age(stamp: str | None, now: datetime) -> str:
    """How long ago an ISO-8601 stamp was, in the largest unit that keeps it short."""
    if not stamp:
        return "-"
    seconds = int((now - datetime.fromisoformat(stamp)).total_seconds())
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


def table(rows: list[list[str]], out: TextIO) -> None:
    """``rows`` (the first is the header) as aligned plain-text columns."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)).rstrip() + "\n")
        if n == 0:
            out.write("  ".join("-" * w for w in widths) + "\n")
