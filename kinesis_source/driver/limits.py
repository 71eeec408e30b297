"""Read limits: where a batch ends when it may hold at most N records.

The tail probe finds each shard's tip, but not how many records lie before it (sequence numbers
are not dense). A limited batch therefore reads its records on the driver, from each shard's
start, and allocates the budget round robin, one Kinesis record at a time (counting the user
records of a KPL aggregate), so that

- the batch never holds more than N user records (one exception: a single Kinesis record that
  alone holds more than N user records forms a batch of its own, since a record is never split);
- every shard with data gets a fair share: a shard whose backlog is smaller than its share
  leaves the rest to the others (max-min fairness), and the shard offered first rotates from
  batch to batch, so none starves, not even one whose next aggregate is larger than its share;
- records are taken in order: a shard whose next record does not fit stops for this batch.

Each shard is read in pages sized to its remaining share; pages of all shards are fetched
concurrently. The cost is on the driver: it reads the batch's records once (the executors read
them again), so read limits are for catching up a backlog in bounded batches, not for steady
state; with no limit the tail probe reads O(1) records per shard.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field

from kinesis_source import kpl
from kinesis_source.aws.kinesis import AsyncKinesis, Page
from kinesis_source.driver.probe import MAX_EMPTY_HOPS, ProbeResult, TailProber
from kinesis_source.errors import ShardNotFoundError, report_shard_gone
from kinesis_source.positions import AFTER, Position, ShardId, seq_key

log = logging.getLogger(__name__)

@dataclass
class _Cursor:
    """One shard's read state while a limited batch is planned."""

    key: ShardId
    start: Position
    cap: str | None = None  # newest record this batch may take (Trigger.AvailableNow)
    buffer: deque = field(default_factory=deque)  # read, not yet allocated
    iterator: str | None = None  # after the buffer's last record; None once the shard ended
    opened: bool = False
    exhausted: bool = False  # nothing more to read for this batch
    beyond_cap: bool = False  # records after ``cap`` were seen (and left alone)
    gap: bool = False  # stopped on empty pages while behind the tip: records may follow
    gone: bool = False  # the stream no longer has the shard
    end: str | None = None  # last record allocated
    taken: int = 0  # user records allocated
    behind_ms: int = 0

    def count(self, record: dict) -> int:
        """User records ``record`` adds to the batch (an aggregate the start is inside counts
        only the user records after it)."""
        n = kpl.count_user_records(record["Data"])
        start = self.start
        if start.kind == AFTER and start.sub_seq is not None and record["SequenceNumber"] == start.seq:
            n = max(n - start.sub_seq - 1, 0)
        return n


class BudgetPlanner:
    """Plans the end of a batch of at most ``budget`` user records across shards."""

    def __init__(self, kinesis: AsyncKinesis, prober: TailProber, page_limit: int) -> None:
        self._kinesis = kinesis
        self._prober = prober
        self._page_limit = page_limit

    async def plan(
        self,
        starts: dict[ShardId, Position],
        budget: int,
        turn: int,
        caps: dict[ShardId, str] | None = None,
    ) -> dict[ShardId, ProbeResult]:
        """Each shard's end for a batch of at most ``budget`` user records.

        ``turn`` rotates which shard is offered a record first (the caller increments it per
        batch). Results look like the tail probe's: ``tip`` is the batch's last record of the
        shard, ``ended`` says the shard is closed with nothing after its start.
        """
        caps = caps or {}
        keys = sorted(starts)
        if keys:
            shift = turn % len(keys)
            keys = keys[shift:] + keys[:shift]
        cursors = [_Cursor(k, starts[k], caps.get(k)) for k in keys]
        await self._allocate(cursors, budget)
        for cur in cursors:
            if cur.opened and not cur.buffer and not cur.beyond_cap:
                # Everything read was taken: the iterator continues right after the end.
                after = Position.after(cur.end) if cur.end is not None else cur.start
                self._prober.keep(*cur.key, after, cur.iterator)
        return {cur.key: _result(cur) for cur in cursors}

    async def _allocate(self, cursors: list[_Cursor], budget: int) -> None:
        active = list(cursors)
        left, total, i = budget, 0, 0
        while active and left > 0:
            i %= len(active)
            cur = active[i]
            if not cur.buffer:
                if cur.exhausted:
                    active.pop(i)
                    continue
                share = max(1, left // len(active))
                empty = [c for c in active if not c.buffer and not c.exhausted]
                await asyncio.gather(*(self._fill(c, share) for c in empty))
                continue
            record = cur.buffer[0]
            n = cur.count(record)
            if n > left:
                if total > 0:
                    active.pop(i)  # its next record does not fit, and records stay in order
                    continue
                log.warning(
                    "Kinesis record %s of shard %s holds %d user records, more than the "
                    "read limit of %d: it forms a batch on its own",
                    record["SequenceNumber"], cur.key, n, budget,
                )
            cur.buffer.popleft()
            cur.end = record["SequenceNumber"]
            cur.taken += n
            left -= n
            total += n
            i += 1

    async def _fill(self, cur: _Cursor, want: int) -> None:
        """Read the shard's next page (about ``want`` records) into its buffer."""
        stream, shard = cur.key
        limit = max(1, min(self._page_limit, want))
        for _ in range(MAX_EMPTY_HOPS + 1):
            if not cur.opened:
                try:
                    page = await self._prober.first_page(stream, shard, cur.start, limit)
                except ShardNotFoundError:
                    cur.gone = cur.exhausted = True
                if cur.gone:  # reported outside the handler: no chained traceback
                    report_shard_gone(stream, shard, cur.start, self._prober.fail_on_data_loss)
                    return
                cur.opened = True
                cur.behind_ms = page.behind_ms
            else:
                assert cur.iterator is not None
                page = await self._kinesis.page(stream, shard, cur.iterator, limit)
            cur.iterator = page.next_iterator
            records = _within_cap(page, cur.cap)
            cur.buffer.extend(records)
            cur.beyond_cap = len(records) < len(page.records)
            if cur.beyond_cap or page.caught_up(limit):
                cur.exhausted = True
            if records or cur.exhausted:
                return
        cur.exhausted = True  # empty pages over a gap: the rest waits for the next batch
        cur.gap = True


def _within_cap(page: Page, cap: str | None) -> list[dict]:
    if cap is None:
        return page.records
    limit = seq_key(cap)
    return [r for r in page.records if seq_key(r["SequenceNumber"]) <= limit]


def _result(cur: _Cursor) -> ProbeResult:
    if cur.end is not None:
        return ProbeResult(tip=cur.end, behind_ms=cur.behind_ms)
    ended = cur.opened and cur.iterator is None and not cur.buffer and not cur.beyond_cap
    return ProbeResult(ended=ended, behind_ms=cur.behind_ms, pending=cur.gap, gone=cur.gone)
