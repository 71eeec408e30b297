"""The canned server's live streams (benchmarks/canned.py): records arrive over time at a set
rate on the fed shards only, and nothing reads a record before it has arrived."""

from __future__ import annotations

import base64
import json

import pytest

from benchmarks import canned
from benchmarks.canned import CannedBackend, KinesisError, StreamSpec, seq_of, shard_id

SPEC = StreamSpec("live", shards=4, records_per_shard=50, record_bytes=10, live_rate=10.0, fed_every=2)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    now = {"t": 1_700_000_000.0}
    monkeypatch.setattr(canned.time, "time", lambda: now["t"])
    return now


def _iterator(backend: CannedBackend, shard: int, kind: str, **extra: str) -> str:
    body = backend.answer("GetShardIterator", {"StreamName": "live", "ShardId": shard_id(shard),
                                               "ShardIteratorType": kind, **extra})
    return json.loads(body)["ShardIterator"]


def _page(backend: CannedBackend, iterator: str, limit: int = 10_000) -> dict:
    return json.loads(backend.get_records({"ShardIterator": iterator, "Limit": limit}))


def test_records_arrive_at_the_rate_and_not_before(clock: dict[str, float]) -> None:
    backend = CannedBackend([SPEC])
    origin = backend.origin
    start = _iterator(backend, 0, "TRIM_HORIZON")
    assert _page(backend, start)["Records"] == []
    clock["t"] = origin + 0.35  # records at +0.1, +0.2, +0.3 s have arrived
    page = _page(backend, start)
    assert [r["SequenceNumber"] for r in page["Records"]] == [str(seq_of(0, i)) for i in range(3)]
    assert [r["ApproximateArrivalTimestamp"] for r in page["Records"]] == pytest.approx(
        [origin + 0.1, origin + 0.2, origin + 0.3], abs=0.002)
    assert [SPEC.arrival(origin, r["SequenceNumber"]) for r in page["Records"]] == pytest.approx(
        [origin + 0.1, origin + 0.2, origin + 0.3])
    assert page["MillisBehindLatest"] == 0
    first = _page(backend, start, limit=1)
    assert len(first["Records"]) == 1 and first["MillisBehindLatest"] == 200
    assert _page(backend, page["NextShardIterator"])["Records"] == []  # the tip, for now
    clock["t"] = origin + 0.45
    assert [r["SequenceNumber"] for r in _page(backend, page["NextShardIterator"])["Records"]] == [
        str(seq_of(0, 3))]


def test_latest_and_sequence_iterators_follow_what_has_arrived(clock: dict[str, float]) -> None:
    backend = CannedBackend([SPEC])
    clock["t"] = backend.origin + 0.55  # five records
    latest = _iterator(backend, 2, "LATEST")
    assert _page(backend, latest)["Records"] == []
    clock["t"] += 0.1
    assert [r["SequenceNumber"] for r in _page(backend, latest)["Records"]] == [str(seq_of(2, 5))]
    with pytest.raises(KinesisError, match="not valid"):  # not issued yet
        _iterator(backend, 2, "AT_SEQUENCE_NUMBER", StartingSequenceNumber=str(seq_of(2, 9)))


def test_only_every_kth_shard_is_fed_and_a_shard_stops_at_its_capacity(clock: dict[str, float]) -> None:
    backend = CannedBackend([SPEC])
    clock["t"] = backend.origin + 100.0  # far past 50 records at 10 a second
    assert SPEC.per_shard() == {shard_id(0): 50, shard_id(1): 0, shard_id(2): 50, shard_id(3): 0}
    assert _page(backend, _iterator(backend, 1, "TRIM_HORIZON"))["Records"] == []
    full = _page(backend, _iterator(backend, 2, "TRIM_HORIZON"))["Records"]
    assert len(full) == 50
    # what a catch-up's physical limit is computed from: the bytes the quota proxy counts
    assert SPEC.shard_bytes() == sum(len(base64.b64decode(r["Data"])) + len(r["PartitionKey"]) for r in full)
