"""One task's writes: rows into ``PutRecords`` requests, refused records retried, per-key order
kept, each shard's write budget spent before sending.

The work queue: user records are read ahead (up to :data:`READ_AHEAD_RECORDS` rows or
:data:`READ_AHEAD_BYTES`), made into Kinesis records (one per row, or KPL aggregates of one
shard's rows), and queued per *ordering unit*: the partition key, or, for an aggregate, its
shard. A request takes records in row order, each only if its shard's budget holds it
(:mod:`~kinesis_source.sink.pacing`); with ``preserveKeyOrder`` it takes only the oldest queued
record of each unit, so a record that Kinesis refuses is sent again before anything after it
of its unit is sent at all. Requests go one at a time, which is what keeps that order; a task
writes as fast as its shards' quotas allow, and Spark runs tasks side by side.

A refused record is queued again in its place: a throttled one when its shard's budget has room
again (the refusal cut the shard's rate), any other after a short backoff
(:class:`~kinesis_source.aws.retries.RetryRule`'s non-throttling delay). After
``maxRecordRetries`` retries of one record the task fails, naming the stream, how many records
were refused and why. Whole-call failures (throttled calls, 5xx, network) are botocore's to
retry (standard mode).

An aggregate that lands on another shard than predicted means the stream resharded: the shard
map is listed again, and the rows of that aggregate that the shard's range does not hold are
queued again in new aggregates (KCL, aws-kinesis-agg with the range, and this source's reader
drop them where they landed), as the KPL does. The landed shard may have closed again by then
(its range is still listed); when even the new listing does not know it, all the aggregate's
rows are sent again.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from kinesis_source.aws.kinesis import THROTTLED, stream_must_exist, unwritable_error
from kinesis_source.aws.retries import RetryRule
from kinesis_source.errors import SinkWriteError
from kinesis_source.kpl import AggregateBuilder
from kinesis_source.sink.options import SinkOptions
from kinesis_source.sink.pacing import WriteBudget
from kinesis_source.sink.rows import MAX_RECORD_BYTES, UserRecord
from kinesis_source.sink.shards import ShardMap

log = logging.getLogger(__name__)

READ_AHEAD_RECORDS = 5000
READ_AHEAD_BYTES = 8 * 1024 * 1024
MAX_REQUEST_BYTES = 5 * 1024 * 1024
# A request is built from at most this many queued records (the rest wait for the next), so a
# queue whose shards are all out of budget is not scanned in full for every request.
MAX_SCAN = 2000


@dataclass
class _Entry:
    """One Kinesis record in the queue."""

    first_row: int  # its first row: the order requests take records in
    unit: str  # ordering unit: partition key, or "shard:<id>" for an aggregate
    shard: str  # the shard it was predicted to land on
    request: dict[str, Any]
    size: int
    users: list[UserRecord]  # the rows it holds (one, or an aggregate's)
    retries: int = 0
    not_before: float = 0.0

    def __lt__(self, other: _Entry) -> bool:
        return self.first_row < other.first_row


@dataclass
class WriteReport:
    """What one task wrote (Spark hands it to the driver's ``commit``)."""

    rows: int = 0
    records: int = 0  # Kinesis records (fewer than rows when aggregating)
    bytes: int = 0
    requests: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # error code -> records refused
    rerouted_rows: int = 0  # aggregated rows sent again after a reshard
    shard_map_refreshes: int = 0

    def add(self, other: WriteReport) -> None:
        """Sum ``other`` into this report."""
        self.rows += other.rows
        self.records += other.records
        self.bytes += other.bytes
        self.requests += other.requests
        for code, n in other.refused.items():
            self.refused[code] = self.refused.get(code, 0) + n
        self.rerouted_rows += other.rerouted_rows
        self.shard_map_refreshes += other.shard_map_refreshes


class Putter:
    """Writes one task's rows to one stream (see the module's docstring)."""

    def __init__(
        self,
        client: Any,
        opts: SinkOptions,
        shards: ShardMap,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._client = client
        self._opts = opts
        self._stream = opts.stream
        self._shards = shards
        self._clock = clock
        self._sleep = sleep
        self._budget = WriteBudget(opts.max_write_rate_per_shard, opts.max_records_per_second_per_shard)
        self._backoff = RetryRule(opts.max_retries, opts.retry_base_delay_ms)
        self._queued: dict[str, deque[_Entry]] = {}  # unit -> its records, oldest first
        self._ready: list[_Entry] = []  # heap by first row: what a request may take
        self._size = 0  # queued records
        self._bytes = 0
        self.report = WriteReport()

    # -- the queue ------------------------------------------------------------------------

    def _enqueue(self, entry: _Entry) -> None:
        self._size += 1
        self._bytes += entry.size
        if not self._opts.preserve_key_order:
            heapq.heappush(self._ready, entry)
            return
        units = self._queued.setdefault(entry.unit, deque())
        units.append(entry)
        if len(units) == 1:
            heapq.heappush(self._ready, entry)

    def _done(self, entry: _Entry) -> None:
        self._size -= 1
        self._bytes -= entry.size
        if not self._opts.preserve_key_order:
            return
        units = self._queued[entry.unit]
        units.popleft()  # a request takes only the oldest record of a unit
        if units:
            heapq.heappush(self._ready, units[0])
        else:
            del self._queued[entry.unit]

    def _fill(self, rows: Iterator[UserRecord]) -> bool:
        """Read rows ahead into the queue; False once the input is spent."""
        taken: list[UserRecord] = []
        nbytes = self._bytes
        more = False
        for user in rows:
            taken.append(user)
            nbytes += user.size
            if self._size + len(taken) >= READ_AHEAD_RECORDS or nbytes >= READ_AHEAD_BYTES:
                more = True
                break
        self.report.rows += len(taken)
        self._queue_rows(taken)
        return more

    def _queue_rows(self, users: list[UserRecord]) -> None:
        if self._opts.aggregate:
            self._aggregate(users)
            return
        for user in users:
            shard = self._shards.shard_of(user.hash_key)
            self._enqueue(_Entry(user.row, user.partition_key, shard, user.entry(), user.size, [user]))

    def _aggregate(self, users: list[UserRecord]) -> None:
        """Queue ``users`` as aggregates, each of one predicted shard's rows in row order."""
        limit = self._opts.aggregation_max_bytes
        open_: dict[str, tuple[AggregateBuilder, list[UserRecord]]] = {}

        def close(shard: str) -> None:
            builder, members = open_.pop(shard)
            first = members[0]
            key = first.partition_key
            request = {"Data": builder.encode(), "PartitionKey": key, "ExplicitHashKey": str(first.hash_key)}
            size = builder.size + len(key.encode())
            self._enqueue(_Entry(first.row, f"shard:{shard}", shard, request, size, members))

        for user in users:
            shard = self._shards.shard_of(user.hash_key)
            if shard in open_:
                builder, members = open_[shard]
                grown = builder.size_with(user.partition_key, user.data, user.explicit_hash_key)
                if grown + len(members[0].partition_key.encode()) > limit:
                    close(shard)
            if shard not in open_:
                open_[shard] = (AggregateBuilder(), [])
            builder, members = open_[shard]
            if builder.count == 0 and builder.size_with(user.partition_key, user.data, user.explicit_hash_key) + len(
                user.partition_key.encode()
            ) > max(limit, MAX_RECORD_BYTES):
                # too big to aggregate within Kinesis' record limit: a record of its own
                del open_[shard]
                self._enqueue(_Entry(user.row, f"shard:{shard}", shard, user.entry(), user.size, [user]))
                continue
            builder.add(user.partition_key, user.data, user.explicit_hash_key)
            members.append(user)
        for shard in list(open_):
            close(shard)

    # -- requests -------------------------------------------------------------------------

    def _request(self, now: float) -> list[_Entry]:
        """The next request's records, their budget spent; empty if none fits now."""
        taken: list[_Entry] = []
        later: list[_Entry] = []
        nbytes = 0
        scanned = 0
        while self._ready and len(taken) < self._opts.max_records_per_request and scanned < MAX_SCAN:
            entry = heapq.heappop(self._ready)
            scanned += 1
            if nbytes + entry.size > MAX_REQUEST_BYTES:
                later.append(entry)
                break
            if entry.not_before > now or not self._budget.take(entry.shard, entry.size, now):
                later.append(entry)
                continue
            taken.append(entry)
            nbytes += entry.size
        for entry in later:
            heapq.heappush(self._ready, entry)
        return taken

    def _wait(self, now: float) -> None:
        """Sleep until the first queued record may be sent (its shard's budget, its backoff)."""
        waits = [
            max(e.not_before - now, self._budget.wait_s(e.shard, e.size, now))
            for e in heapq.nsmallest(MAX_SCAN, self._ready)
        ]
        self._sleep(max(0.001, min(waits)))

    def _send(self, entries: list[_Entry]) -> None:
        try:
            with stream_must_exist(self._stream):
                resp = self._client.put_records(StreamName=self._stream, Records=[e.request for e in entries])
        except ClientError as exc:
            raise unwritable_error(exc, self._stream) or exc from None
        self.report.requests += 1
        now = self._clock()
        for shard in {e.shard for e in entries}:
            self._budget.answered(shard, now)
        refused: Counter[str] = Counter()
        given_up: Counter[str] = Counter()
        throttled: set[str] = set()
        mislanded: list[tuple[_Entry, str]] = []
        for entry, result in zip(entries, resp["Records"], strict=True):
            code = result.get("ErrorCode")
            if code is None:
                self.report.records += 1
                self.report.bytes += entry.size
                self._done(entry)
                if result.get("ShardId", entry.shard) != entry.shard:
                    mislanded.append((entry, result["ShardId"]))
                continue
            refused[code] += 1
            entry.retries += 1
            if code == THROTTLED:
                throttled.add(entry.shard)
            else:
                entry.not_before = now + self._backoff.delay(entry.retries, throttled=False)
            if entry.retries > self._opts.max_record_retries:
                given_up[code] += 1
            heapq.heappush(self._ready, entry)  # with preserveKeyOrder, still its unit's oldest
        for shard in throttled:
            self._budget.refused(shard, now)
        for code, n in refused.items():
            self.report.refused[code] = self.report.refused.get(code, 0) + n
        if given_up:
            shown = ", ".join(f"{code} x{n}" for code, n in given_up.most_common())
            waiting = self._size - given_up.total()
            raise SinkWriteError(
                f"{given_up.total()} records could not be written to Kinesis stream '{self._stream}': "
                f"Kinesis refused each of them {self._opts.max_record_retries + 1} times (last "
                f"answers: {shown}); {waiting} more of this task's records were waiting to be "
                "sent. Its other records were written (writes are at least once). Raise option "
                "'maxRecordRetries', or lower 'maxWriteRatePerShard' if other writers share the "
                "shards."
            )
        if mislanded:
            self._rerouted(mislanded)

    def _rerouted(self, mislanded: list[tuple[_Entry, str]]) -> None:
        """Records landed off the shard map, so the stream resharded: list its shards again,
        and queue again the rows of aggregates that landed on a shard not holding them."""
        self._shards = ShardMap.load(self._client, self._stream)
        self.report.shard_map_refreshes += 1
        if not self._opts.aggregate:
            return  # Kinesis routed each record by its own key: all were delivered
        for entry, shard_id in mislanded:
            # a shard the new map does not know either: its range is unknown, so every row is
            # sent again (a duplicate is better than a row its readers drop)
            outside = [u for u in entry.users if not self._shards.holds(shard_id, u.hash_key)]
            if outside:
                self.report.rerouted_rows += len(outside)
                log.info(
                    "An aggregate for shard %s of stream %s landed on %s after a reshard: %d of its "
                    "%d rows are outside that shard's range and are sent again",
                    entry.shard, self._stream, shard_id, len(outside), len(entry.users),
                )
                self._queue_rows(outside)

    # -- the task's loop ------------------------------------------------------------------

    def write(self, rows: Iterable[UserRecord]) -> WriteReport:
        """Write every row; returns what was written. Raises :class:`SinkWriteError` when
        records are refused past their retries (the rows before them stay written)."""
        source = iter(rows)
        more = True
        while True:
            if more and self._size < READ_AHEAD_RECORDS // 2 and self._bytes < READ_AHEAD_BYTES // 2:
                more = self._fill(source)
            if not self._size:
                if not more:
                    return self.report
                continue
            now = self._clock()
            entries = self._request(now)
            if entries:
                self._send(entries)
            else:
                self._wait(now)
