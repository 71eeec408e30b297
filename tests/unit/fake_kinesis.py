"""An in-memory Kinesis shard log for unit tests of the planner and the range reader.

It serves the four calls those modules make (ListShards, GetShardIterator, GetRecords, with
MillisBehindLatest computed from arrival times like AWS) and records what it served, so tests can
check which records a probe read. Integration tests use a real server instead.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from types import SimpleNamespace

from botocore.exceptions import ClientError
from botocore.hooks import HierarchicalEmitter


@dataclass
class FakeShard:
    """One shard: records as (seq, arrival epoch seconds), maybe closed."""

    records: list[tuple[str, float]] = field(default_factory=list)
    closed: bool = False
    payloads: dict[str, bytes] = field(default_factory=dict)  # Data by seq; default b"d<seq>"
    # Empty pages (with MillisBehindLatest > 0) an iterator crosses before record index i, as
    # real Kinesis serves over gaps in a sparse shard (index len(records): before the tip).
    gaps: dict[int, int] = field(default_factory=dict)
    hash_range: tuple[int, int] | None = None  # listed as HashKeyRange when set


def _check_order(shard_id: str, records: list[tuple[str, float]]) -> None:
    """A shard's sequence numbers increase as integers (a test that appends records must
    append larger ones; string order is not the order, see :func:`log_of`)."""
    seqs = [int(s) for s, _ in records]
    assert all(a < b for a, b in itertools.pairwise(seqs)), f"fake shard {shard_id}: out of order"


def _error(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}}, "Op")


class FakeKinesis:
    """Synchronous fake; :class:`AsyncFake` wraps it for the driver code."""

    def __init__(self, shards: dict[str, FakeShard], stream: str = "s") -> None:
        self.stream = stream
        self.shards = shards
        self.served: list[str] = []  # sequence numbers returned by GetRecords, in order
        self.calls: list[str] = []
        self.limits: list[int] = []  # the Limit of every GetRecords, in order
        # every GetRecords as (shard, monotonic time, StreamARN given or None), in order
        self.get_records_log: list[tuple[str, float, str | None]] = []
        self.expire_next: int = 0  # the next N GetRecords calls raise ExpiredIteratorException
        self.throttle_next: int = 0  # the next N GetRecords calls are refused for throughput
        # Added to every non-zero MillisBehindLatest, as if it were measured to "now".
        self.behind_extra_ms: int = 0
        # botocore's event system, as a client has it: GetRecords emits before-parse (for
        # note_receipts) as a real client does once the answer is in
        self.meta = SimpleNamespace(events=HierarchicalEmitter())

    # iterators are "<shard>|<index of next record>|<empty pages crossed before it>"
    def get_shard_iterator(self, StreamName, ShardId, ShardIteratorType, **kw):
        self.calls.append("GetShardIterator")
        if StreamName != self.stream or ShardId not in self.shards:
            raise _error("ResourceNotFoundException")
        recs = self.shards[ShardId].records
        _check_order(ShardId, recs)
        if ShardIteratorType == "TRIM_HORIZON":
            idx = 0
        elif ShardIteratorType == "AT_TIMESTAMP":
            ts = kw["Timestamp"]
            t = ts.timestamp() if isinstance(ts, datetime) else float(ts)
            idx = next((i for i, (_, a) in enumerate(recs) if a >= t), len(recs))
        else:
            seq = int(kw["StartingSequenceNumber"])
            idx = next((i for i, (s, _) in enumerate(recs) if int(s) >= seq), len(recs))
            if ShardIteratorType == "AFTER_SEQUENCE_NUMBER" and idx < len(recs) and int(recs[idx][0]) == seq:
                idx += 1
        return {"ShardIterator": f"{ShardId}|{idx}|0"}

    def get_records(self, ShardIterator, Limit, StreamARN=None):
        self.calls.append("GetRecords")
        self.limits.append(Limit)
        self.get_records_log.append((ShardIterator.split("|")[0], time.monotonic(), StreamARN))
        if self.expire_next:
            self.expire_next -= 1
            raise _error("ExpiredIteratorException")
        if self.throttle_next:
            self.throttle_next -= 1
            raise _error("ProvisionedThroughputExceededException")
        shard_id, idx, crossed = ShardIterator.split("|")
        shard = self.shards[shard_id]
        idx, crossed = int(idx), int(crossed)
        if crossed < shard.gaps.get(idx, 0):
            newest = shard.records[-1][1] if shard.records else 0.0
            here = shard.records[idx][1] if idx < len(shard.records) else newest
            return {
                "Records": [],
                "MillisBehindLatest": max(1, int((newest - here) * 1000)) + self.behind_extra_ms,
                "NextShardIterator": f"{shard_id}|{idx}|{crossed + 1}",
            }
        # A page ends before the next gap: the records after it are behind the empty pages.
        stop = min([i for i in shard.gaps if idx < i] + [idx + Limit])
        page = shard.records[idx : min(idx + Limit, stop)]
        nxt = idx + len(page)
        behind = 0
        if page and nxt < len(shard.records):
            behind = int((shard.records[-1][1] - page[-1][1]) * 1000)
        elif not page and nxt < len(shard.records):
            behind = int((shard.records[-1][1] - shard.records[nxt][1]) * 1000)
        if behind:
            behind += self.behind_extra_ms
        self.served.extend(s for s, _ in page)
        out = {
            "Records": [
                {
                    "Data": shard.payloads.get(s, f"d{s}".encode()),
                    "PartitionKey": "k",
                    "SequenceNumber": s,
                    "ApproximateArrivalTimestamp": datetime.fromtimestamp(a, tz=timezone.utc),
                }
                for s, a in page
            ],
            "MillisBehindLatest": behind,
        }
        if not (shard.closed and nxt >= len(shard.records)):
            out["NextShardIterator"] = f"{shard_id}|{nxt}|0"
        self.meta.events.emit("before-parse.kinesis.GetRecords")
        return out

    def describe_stream_summary(self, StreamName):
        self.calls.append("DescribeStreamSummary")
        if StreamName != self.stream:
            raise _error("ResourceNotFoundException")
        return {"StreamDescriptionSummary": {"StreamName": StreamName, "StreamStatus": "ACTIVE"}}

    def list_shards(self, StreamName, **kw):
        self.calls.append("ListShards")
        shards = []
        for shard_id, shard in self.shards.items():
            listed: dict = {"ShardId": shard_id, "SequenceNumberRange": {}}
            if shard.hash_range is not None:
                first, last = shard.hash_range
                listed["HashKeyRange"] = {"StartingHashKey": str(first), "EndingHashKey": str(last)}
            shards.append(listed)
        return {"Shards": shards}


class AsyncFake:
    """The async face of :class:`FakeKinesis`, as aiobotocore's client would be."""

    def __init__(self, fake: FakeKinesis) -> None:
        self.fake = fake

    async def get_shard_iterator(self, **kw):
        return self.fake.get_shard_iterator(**kw)

    async def get_records(self, **kw):
        return self.fake.get_records(**kw)

    async def describe_stream_summary(self, **kw):
        return self.fake.describe_stream_summary(**kw)

    async def list_shards(self, **kw):
        return self.fake.list_shards(**kw)

    async def __aexit__(self, *exc):
        return None


def log_of(n: int, start_time: float = 1_000_000.0, spacing: float = 0.01, offset: int = 0):
    """``n`` records, ``spacing`` seconds apart, whose sequence numbers cross digit-count
    boundaries, so that comparing them as strings gives another order than as integers: the
    first half goes from 9 to 10 digits (across 10**9), the second from 55 to 56 digits
    (across 10**55; real Kinesis and kinesis-local numbers have 56). ``offset`` is added to
    each, so that several shards' logs differ."""
    low = n // 2
    seqs = [10**9 + 7 * (i - low // 2) for i in range(low)]
    seqs += [10**55 + 7 * (i - (n - low) // 2) for i in range(n - low)]
    return [(str(seq + offset), start_time + i * spacing) for i, seq in enumerate(seqs)]
