"""The tail probe and range planning, against an in-memory shard log."""

from __future__ import annotations

import asyncio

import pytest

from kinesis_source.aws.kinesis import AsyncKinesis, ShardInfo
from kinesis_source.driver.planner import Planner, plan_ranges
from kinesis_source.driver.probe import ProbeResult, TailProber, probe_all, settle_all
from kinesis_source.errors import DataLossError
from kinesis_source.options import SourceOptions
from kinesis_source.positions import Offset, Position, ShardId, ShardRange, seq_key
from tests.unit.fake_kinesis import AsyncFake, FakeKinesis, FakeShard, log_of


def prober_for(shards):
    fake = FakeKinesis(shards)
    kinesis = AsyncKinesis(AsyncFake(fake))
    return fake, kinesis, TailProber(kinesis, page_limit=10000)


def probe(prober, start, shard="a"):
    return asyncio.run(prober.probe("s", shard, start))


def test_backlog_tip_found_reading_few_records():
    recs = log_of(10_000)
    fake, kinesis, prober = prober_for({"a": FakeShard(recs)})
    result = probe(prober, Position.trim_horizon())
    assert result.tip == recs[-1][0]
    # one record after the start, then the last few ms before the tip
    assert kinesis.records_fetched <= 5, kinesis.records_fetched
    assert len(fake.calls) <= 4


def test_probe_finds_the_tip_across_digit_counts():
    """The tip is the record with the largest sequence number as an integer, across the fake's
    9 -> 10 and 55 -> 56 digit boundaries (as a string, "999999993" sorts after
    "1000000000"). Mutant caught: ``seq_key`` returning the string itself."""
    for n, start in ((10, 1), (4, 0), (20, 12)):
        recs = log_of(n)
        fake, kinesis, prober = prober_for({"a": FakeShard(recs)})
        assert probe(prober, Position.after(recs[start][0])).tip == recs[-1][0]
        assert probe(prober, Position.trim_horizon()).tip == recs[-1][0]
    low = log_of(10)[:5]  # 999999986 .. 1000000014: the tip has 10 digits, the start 9
    fake, kinesis, prober = prober_for({"a": FakeShard(low)})
    assert probe(prober, Position.after(low[0][0])).tip == "1000000014"


def test_tip_found_when_the_stream_went_quiet_long_ago():
    recs = log_of(1000, start_time=1_000_000.0)
    # a burst an hour later; the newest record is what must be found
    last = int(recs[-1][0])
    recs += [(str(last + 10**6 + i), 1_003_600.0 + i * 0.0001) for i in range(50)]
    fake, kinesis, prober = prober_for({"a": FakeShard(recs)})
    result = probe(prober, Position.after(recs[10][0]))
    assert result.tip == recs[-1][0]
    assert kinesis.records_fetched <= 52  # the start's record, the next one, the burst


def test_empty_window_widens_until_it_holds_records():
    recs = log_of(2000, spacing=1.0)  # one record a second: 5 ms before the tip holds only it
    fake, kinesis, prober = prober_for({"a": FakeShard(recs)})
    # MillisBehindLatest overstated by 2 s: the first windows open after the tip and are empty
    fake.behind_extra_ms = 2000
    result = probe(prober, Position.after(recs[0][0]))
    assert result.tip == recs[-1][0]
    assert fake.calls.count("GetShardIterator") >= 3, "expected the window to widen"
    assert kinesis.records_fetched <= 5


def test_probe_never_reads_before_its_start():
    recs = [(str(100 + i), 5000.0 + i * 0.0001) for i in range(200)]  # one dense burst
    fake, kinesis, prober = prober_for({"a": FakeShard(recs)})
    start = recs[150][0]
    result = probe(prober, Position.after(start))
    assert result.tip == recs[-1][0]
    # the start's own record is read once, to see it was not trimmed; nothing before it
    assert fake.served and min(seq_key(s) for s in fake.served) == seq_key(start)
    assert fake.served.count(start) == 1


def test_idle_shard_costs_one_call_after_the_first_probe():
    recs = log_of(10)
    fake, kinesis, prober = prober_for({"a": FakeShard(recs)})
    start = Position.after(recs[-1][0])
    assert probe(prober, start).tip is None
    calls = len(fake.calls)
    assert probe(prober, start).tip is None
    assert len(fake.calls) - calls == 1, fake.calls[calls:]


def test_continuation_after_tip_is_reused_by_the_next_probe():
    recs = log_of(100)
    shard = FakeShard(recs)
    fake, kinesis, prober = prober_for({"a": shard})
    tip = probe(prober, Position.trim_horizon()).tip
    last = int(recs[-1][0])
    shard.records += [(str(last + 10**4 + i), recs[-1][1] + 1 + i * 0.01) for i in range(3)]
    calls = len(fake.calls)
    result = probe(prober, Position.after(tip))
    assert result.tip == shard.records[-1][0]
    assert "GetShardIterator" not in fake.calls[calls : calls + 1]


def test_a_busy_shard_is_not_read_twice_by_the_probe():
    """Going on from its last tip over 2,000 new records, the probe reads about ``warm_bytes``
    of them (the run it returns, which the executors do not read again: they get it carried)
    and those near the new tip, not the batch. Mutants caught: the warm read's limit at 1,000
    records past its bytes, and a run that is not the records right after the start."""
    recs = log_of(10)
    shard = FakeShard(recs)
    fake, kinesis, prober = prober_for({"a": shard})
    tip = probe(prober, Position.trim_horizon()).tip
    last, at = int(recs[-1][0]), recs[-1][1]
    shard.records += [(str(last + 10**4 + i), at + 1 + i * 0.01) for i in range(2000)]
    fetched = kinesis.records_fetched
    result = probe(prober, Position.after(tip))
    assert result.tip == shard.records[-1][0]
    run = [r["SequenceNumber"] for r in result.run]
    assert 0 < len(run) <= 1000 and run == [seq for seq, _ in shard.records[10:10 + len(run)]]
    near_tip = kinesis.records_fetched - fetched - len(result.run)
    assert near_tip <= 20, near_tip


@pytest.mark.parametrize("payload_bytes", [10, 10_000])
def test_the_probes_warm_read_asks_for_fewer_records_where_they_are_large(payload_bytes):
    """The warm read asks for about ``warm_bytes`` of records, by the size of the shard's
    records seen so far (10 KB records: one; 10-byte ones: a thousand)."""

    recs = log_of(30)
    shard = FakeShard(recs[:10], payloads={seq: b"x" * payload_bytes for seq, _ in recs})
    fake, _, prober = prober_for({"a": shard})
    limits = fake.limits
    tip = probe(prober, Position.trim_horizon()).tip
    shard.records += recs[10:12]
    limits.clear()
    assert probe(prober, Position.after(tip)).tip == recs[11][0]
    assert prober.warm_bytes == 10_000
    assert limits[0] == (1 if payload_bytes == 10_000 else 1000)


def test_expired_continuation_is_re_derived():
    recs = log_of(10)
    fake, kinesis, prober = prober_for({"a": FakeShard(recs)})
    start = Position.after(recs[-1][0])
    probe(prober, start)
    fake.expire_next = 1
    assert probe(prober, start).tip is None
    assert fake.calls[-3:] == ["GetRecords", "GetShardIterator", "GetRecords"]


def test_closed_shard_read_to_its_end_reports_ended():
    recs = log_of(5)
    fake, kinesis, prober = prober_for({"a": FakeShard(recs, closed=True)})
    assert probe(prober, Position.trim_horizon()).tip == recs[-1][0]
    assert probe(prober, Position.after(recs[-1][0])).ended


def test_empty_shard_has_no_tip():
    fake, kinesis, prober = prober_for({"a": FakeShard([])})
    result = probe(prober, Position.trim_horizon())
    assert result.tip is None and not result.ended


def test_probe_all_covers_every_shard():
    shards = {f"sh{i}": FakeShard(log_of(50 + i, offset=i)) for i in range(5)}
    fake, kinesis, prober = prober_for(shards)
    starts = {ShardId("s", k): Position.trim_horizon() for k in shards}
    results = asyncio.run(probe_all(prober, starts))
    assert {k[1]: r.tip for k, r in results.items()} == {
        k: v.records[-1][0] for k, v in shards.items()
    }


def test_plan_ranges_from_two_offsets():
    start = Offset(
        {
            ShardId("s", "a"): Position.after("10"),
            ShardId("s", "b"): Position.after("5"),
            ShardId("s", "c"): Position.trim_horizon(),
        }
    )
    end = Offset(
        {
            ShardId("s", "a"): Position.after("20"),
            ShardId("s", "b"): Position.after("5"),  # unchanged: no range
            ShardId("s", "c"): Position.shard_end(),  # ended with no records: no range
            ShardId("s", "d"): Position.after("3"),  # new shard: from TRIM_HORIZON
        }
    )
    assert plan_ranges(start, end) == [
        ShardRange("s", "a", Position.after("10"), "20"),
        ShardRange("s", "d", Position.trim_horizon(), "3"),
    ]


@pytest.mark.parametrize(
    "start, want",
    [
        (Position.trim_horizon(), "TRIM_HORIZON"),
        (Position.after("99"), "AFTER:99"),
        (Position.after("999999999", 3), "AFTER:999999999:3"),
    ],
)
def test_plan_ranges_is_deterministic(start, want):
    """The ranges planned from two offsets are the same after the offsets' JSON round trip (a
    replayed batch reads Spark's offset log), and they are the ranges written out here: with
    only a comparison of the two, a plan_ranges returning [] (or a wrong range) passed."""
    a = Offset({ShardId("s", "a"): start, ShardId("t", "b"): Position.after("5")})
    b = Offset({ShardId("s", "a"): Position.after("1000000000"), ShardId("t", "b"): Position.after("7")})
    expected = [
        ("s", "a", want, "1000000000"),
        ("t", "b", "AFTER:5", "7"),
    ]
    for start_offset, end_offset in ((a, b), (Offset.from_json(a.to_json()), Offset.from_json(b.to_json()))):
        got = plan_ranges(start_offset, end_offset)
        assert [(r.stream, r.shard_id, r.start.to_str(), r.end_seq) for r in got] == expected


def test_plan_ranges_come_in_the_offsets_text_order():
    """Partitions follow the offset's JSON keys ("a-b/x" before "a/x"), not tuple order."""
    start = Offset({ShardId("a", "x"): Position.trim_horizon(), ShardId("a-b", "x"): Position.trim_horizon()})
    end = Offset({ShardId("a", "x"): Position.after("1"), ShardId("a-b", "x"): Position.after("2")})
    assert [str(r.shard) for r in plan_ranges(start, end)] == ["a-b/x", "a/x"]


def test_records_of_one_millisecond_are_one_batch_not_one_each():
    # Real Kinesis reports MillisBehindLatest in whole ms: 0 after the first of a burst
    recs = [(str(10**55 + i), 7000.0) for i in range(50)]
    fake, kinesis, prober = prober_for({"a": FakeShard(recs)})
    assert probe(prober, Position.trim_horizon()).tip == recs[-1][0]


def test_trimmed_start_fails_naming_stream_shard_and_position():
    recs = log_of(100)
    fake, kinesis, prober = prober_for({"a": FakeShard(recs[40:])})  # the first 40 were trimmed
    with pytest.raises(DataLossError) as err:
        probe(prober, Position.after(recs[10][0]))
    message = str(err.value)
    assert "stream 's' shard 'a'" in message and f"AFTER:{recs[10][0]}" in message
    assert f"the oldest record left is {recs[40][0]}" in message and "failOnDataLoss=false" in message


def test_trimmed_start_goes_on_from_the_oldest_record_when_allowed():
    recs = log_of(100)
    fake = FakeKinesis({"a": FakeShard(recs[40:])})
    prober = TailProber(AsyncKinesis(AsyncFake(fake)), page_limit=10000, fail_on_data_loss=False)
    assert probe(prober, Position.after(recs[10][0])).tip == recs[-1][0]


def test_untrimmed_start_is_not_data_loss():
    recs = log_of(100)
    fake, kinesis, prober = prober_for({"a": FakeShard(recs)})
    assert probe(prober, Position.after(recs[10][0])).tip == recs[-1][0]
    assert probe(prober, Position.at(recs[99][0])).tip == recs[99][0]


def test_available_now_target_bounds_which_shards_are_probed():
    from kinesis_source.driver.planner import Target

    tips = {ShardId("s", "a"): "100", ShardId("s", "b"): None, ShardId("s", "c"): "50", ShardId("s", "d"): "70"}
    target = Target({sid: ProbeResult(tip=tip) for sid, tip in tips.items()}, frozenset({ShardId("s", "z")}))
    starts = {
        ShardId("s", "a"): Position.after("99"),  # before its cap: probed, capped
        ShardId("s", "b"): Position.trim_horizon(),  # empty when the run started
        ShardId("s", "c"): Position.after("50"),  # at its cap: done
        ShardId("s", "d"): Position.after("70", 2),  # inside the cap's aggregate: the rest is in
        ShardId("s", "z"): Position.after("5"),  # closed at the start: to its end, no cap
        ShardId("s", "new"): Position.trim_horizon(),  # created during the run: all newer
    }
    kept, caps = target.bound(starts)
    assert set(kept) == {ShardId("s", "a"), ShardId("s", "d"), ShardId("s", "z")}
    assert caps == {ShardId("s", "a"): "100", ShardId("s", "d"): "70"}


def test_sparse_shard_probe_goes_on_across_empty_pages_and_shows_its_lag():
    """Issue 14 item 2: Kinesis may serve many empty pages (MillisBehindLatest > 0) before a
    sparse shard's records. Each probe goes on from where the last one stopped (it started
    over and never got through before), and while it has found nothing it reports the shard
    as behind, not caught up."""
    recs = log_of(20)
    fake, kinesis, prober = prober_for({"a": FakeShard(recs, gaps={0: 12})})
    results = []
    for _ in range(6):
        results.append(probe(prober, Position.trim_horizon()))
        if results[-1].tip is not None:
            break
    assert results[-1].tip == recs[-1][0]
    assert all(r.pending and r.behind_ms > 0 for r in results[:-1])
    # the 12 empty pages were crossed once in all, not once per probe
    assert fake.calls.count("GetRecords") <= 12 + 2 * len(results)


def test_settle_all_finds_the_tip_behind_empty_pages_in_one_call():
    recs = log_of(20)
    fake, kinesis, prober = prober_for({"a": FakeShard(recs, gaps={0: 12}), "b": FakeShard(recs)})
    starts = {ShardId("s", "a"): Position.trim_horizon(), ShardId("s", "b"): Position.trim_horizon()}
    results = asyncio.run(settle_all(prober, starts, pause_s=0))
    assert {k: r.tip for k, r in results.items()} == {k: recs[-1][0] for k in starts}


def test_settle_all_gives_up_at_its_deadline_leaving_the_shard_pending():
    recs = log_of(20)
    fake, kinesis, prober = prober_for({"a": FakeShard(recs, gaps={0: 10_000})})
    results = asyncio.run(settle_all(prober, {ShardId("s", "a"): Position.trim_horizon()}, timeout_s=0))
    assert results[ShardId("s", "a")].pending and results[ShardId("s", "a")].tip is None


def test_probe_of_a_shard_gone_since_the_listing_is_data_loss_or_gone():
    """Issue 14 item 8 on the driver: the shard expired between ListShards and
    GetShardIterator. It is data loss naming the shard (not "stream not found"), and with
    failOnDataLoss=false the probe says it is gone."""
    recs = log_of(5)
    fake, kinesis, prober = prober_for({"a": FakeShard(recs)})
    with pytest.raises(DataLossError, match="stream 's' no longer has shard 'zz'"):
        asyncio.run(prober.probe("s", "zz", Position.after(recs[1][0])))
    lenient = TailProber(kinesis, page_limit=100, fail_on_data_loss=False)
    result = asyncio.run(lenient.probe("s", "zz", Position.after(recs[1][0])))
    assert result.gone and result.tip is None


def test_shard_info_reads_the_hash_key_range_as_integers():
    raw = {
        "ShardId": "shardId-000000000001",
        "HashKeyRange": {"StartingHashKey": str(2**127), "EndingHashKey": str(2**128 - 1)},
        "SequenceNumberRange": {"StartingSequenceNumber": "1"},
    }
    assert ShardInfo.from_api(raw).hash_range == (2**127, 2**128 - 1)
    assert ShardInfo.from_api({"ShardId": "x"}).hash_range is None


def planner_on(fake):
    opts = SourceOptions.parse({"streamName": "s", "applicationName": "app", "region": "us-east-1"})
    return Planner(opts, AsyncKinesis(AsyncFake(fake)))


def test_hash_ranges_lists_the_shards_once_and_keys_them_like_offsets():
    fake = FakeKinesis({"a": FakeShard(hash_range=(0, 99)), "b": FakeShard()})
    planner = planner_on(fake)
    try:
        assert planner.hash_ranges() == {ShardId("s", "a"): (0, 99), ShardId("s", "b"): None}
        assert planner.hash_ranges() == {ShardId("s", "a"): (0, 99), ShardId("s", "b"): None}
        assert fake.calls.count("ListShards") == 1
    finally:
        planner.close()

