"""Records the driver already read, carried to the executor that reads their range
(``driver/carried.py``): from the probe's warm reads and from executors' reports."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone

import pytest

from kinesis_source.driver.budget import GET_RECORDS, CallBudget
from kinesis_source.driver.carried import CarriedRun
from kinesis_source.driver.planner import plan_ranges
from kinesis_source.executor.polling import RangeReader
from kinesis_source.positions import Position, ShardId, ShardRange
from kinesis_source.tip_reports import (
    CARRIED_BYTES_PER_MESSAGE,
    CARRIED_BYTES_PER_SHARD,
    MAX_MESSAGE_BYTES,
    TipReport,
    carried_size,
    decode,
    encode,
    within_carry_budget,
)
from tests.support.waiting import wait_for
from tests.unit.fake_kinesis import FakeShard, log_of
from tests.unit.test_tip_reports import applied, reporting_planner
from tests.unit.test_tips import TimedFake, trim_horizon

A = ShardId("s", "a")


def records(recs, payloads=None):
    """Kinesis records as GetRecords gives them for ``(seq, arrival)`` pairs of the fake log."""
    payloads = payloads or {}
    return [{"SequenceNumber": seq, "Data": payloads.get(seq, f"d{seq}".encode()), "PartitionKey": "k",
             "ApproximateArrivalTimestamp": datetime.fromtimestamp(at, tz=timezone.utc)} for seq, at in recs]


def seqs(rs):
    return [r["SequenceNumber"] for r in rs]


def test_a_run_gives_a_range_its_records_and_keeps_what_lies_past_its_end():
    recs = log_of(20)
    run = CarriedRun(recs[4][0], records(recs[5:12]), "it-after-11")
    taken, whole, iterator, rest = run.take(recs[8][0])
    assert seqs(taken) == [s for s, _ in recs[5:9]] and whole and iterator is None
    assert rest is not None and rest.after == recs[8][0] and seqs(rest.records) == [s for s, _ in recs[9:12]]
    # a range past the run: all of it, and the iterator that reads on after its last record
    taken, whole, iterator, rest = rest.take(recs[15][0])
    assert seqs(taken) == [s for s, _ in recs[9:12]] and not whole and iterator == "it-after-11" and rest is None
    # an end that is no record of the run, though records lie past it: nothing is carried
    assert CarriedRun(recs[4][0], records(recs[5:12]), None).take(str(int(recs[7][0]) + 1))[:3] == ((), False, None)
    # runs grow only from their last record, within their cap
    grown = run.extended(recs[11][0], records(recs[12:14]), "it-after-13", cap=10**6)
    assert grown is not None and seqs(grown.records) == [s for s, _ in recs[5:14]]
    assert grown.next_iterator == "it-after-13"
    assert run.extended(recs[10][0], records(recs[11:14]), None, cap=10**6) is None
    assert run.extended(recs[11][0], records(recs[12:14]), None, cap=run.size) is None


def test_a_range_the_probe_read_whole_goes_in_the_partition_and_its_read_makes_no_call():
    """The probe went on from its last tip and read everything to the new tip: those records
    are the next range, so the partition carries them, the executor makes no Kinesis call and
    sends no report, no executor call is booked, and the shard's probes may spend the whole
    budget. Mutant caught: the run not taken by the hand-over (the read called GetRecords)."""
    recs = log_of(40)
    fake = TimedFake({"a": FakeShard(recs[:10])})
    planner = reporting_planner(fake)
    try:
        start = trim_horizon(A)
        end = planner.latest_offset(start)
        assert end.shards[A] == Position.after(recs[9][0])
        first, _ = planner.hand_over(plan_ranges(start, end))
        assert first[A][5] == ()  # a cold probe jumped to the tip: nothing to carry
        fake.shards["a"].records.extend(recs[10:15])
        nxt = wait_for(lambda: (e := planner.latest_offset(end)).shards[A] != end.shards[A] and e,
                       timeout=10, what="the probe's new tip")
        assert nxt.shards[A] == Position.after(recs[14][0])
        booked_before = planner.stats()["executorReadsBooked"]
        (rng,) = plan_ranges(end, nxt)
        booking = planner.hand_over([rng])[0][A]
        carried = booking[5]
        assert seqs(carried) == [s for s, _ in recs[10:15]]
        assert booking[0] is None and booking[3] is None  # no iterator, no byte model: no call
        assert planner.stats()["executorReadsBooked"] == booked_before
        assert planner.stats()["rangesCarried"] == 1 and planner.stats()["recordsCarried"] == 5
        assert planner.budget.reserve(GET_RECORDS, A) == 0
        calls = len(fake.calls)
        reader = RangeReader(fake, rng, 100, carried=carried)
        assert [s for page in reader.pages() for s in seqs(page)] == [s for s, _ in recs[10:15]]
        assert len(fake.calls) == calls and reader.tip_report() is None
    finally:
        planner.close()


def test_the_records_a_read_saw_past_its_end_are_the_next_ranges_records():
    """An executor's report carries the records it saw past its range's end: the next range
    (from that end to the reported record) is those records, handed over with no read; a
    report whose records do not agree with what it says it saw past its end carries nothing."""
    recs = log_of(40)
    fake = TimedFake({"a": FakeShard(recs[:10])})
    planner = reporting_planner(fake, minProbeIntervalMs="600000", maxIdleProbeIntervalMs="600000")
    try:
        start = trim_horizon(A)
        end = planner.latest_offset(start)
        _, address = planner.hand_over(plan_ranges(start, end))
        fake.shards["a"].records.extend(recs[10:16])
        past = tuple(records(recs[10:16]))
        assert applied(address, [TipReport(A, recs[15][0], 0, "a|16|0", {}, recs[9][0], 6, 1, 1, carried=past)])
        nxt = planner.latest_offset(end)
        assert nxt.shards[A] == Position.after(recs[15][0])
        booking = planner.hand_over(plan_ranges(end, nxt))[0][A]
        assert booking[5] == past
        # records that do not follow the reported end are not carried
        fake.shards["a"].records.extend(recs[16:20])
        wrong = tuple(records(recs[17:20]))  # record 16 is missing: 3 records, not the 4 it saw
        assert applied(address, [TipReport(A, recs[19][0], 0, "a|20|0", {}, recs[15][0], 4, 1, 1, carried=wrong)])
        later = planner.latest_offset(nxt)
        assert later.shards[A] == Position.after(recs[19][0])
        booking = planner.hand_over(plan_ranges(nxt, later))[0][A]
        assert booking[5] == () and booking[0] is not None  # read by the executor, with the report's iterator
    finally:
        planner.close()


def test_a_range_longer_than_its_run_reads_the_rest_after_the_run():
    """The partition carries the range's first records: the read emits them without a call and
    reads the rest from the iterator after them (no GetShardIterator), or, without one, opens
    at the last carried record; each record once, in order."""
    recs = log_of(30)
    rng = ShardRange("s", "a", Position.after(recs[9][0]), recs[24][0])
    want = [s for s, _ in recs[10:25]]
    fake = TimedFake({"a": FakeShard(recs)})
    reader = RangeReader(fake, rng, 100, opener=("a|15|0", None), carried=tuple(records(recs[10:15])))
    assert [s for page in reader.pages() for s in seqs(page)] == want
    assert "GetShardIterator" not in fake.calls and reader.handed_over
    report = reader.tip_report()
    assert report is not None and report.in_range == 15 and report.read_bytes == sum(
        len(f"d{s}") for s, _ in recs[15:30])  # only what it received: not the carried records
    fake.calls.clear()
    reader = RangeReader(fake, rng, 100, carried=tuple(records(recs[10:15])))
    assert [s for page in reader.pages() for s in seqs(page)] == want
    assert fake.calls.count("GetShardIterator") == 1


def test_a_read_reports_the_records_past_its_end_when_they_are_few():
    recs = log_of(30)
    rng = ShardRange("s", "a", Position.after(recs[9][0]), recs[19][0])
    fake = TimedFake({"a": FakeShard(recs)})
    reader = RangeReader(fake, rng, 100)
    list(reader.pages())
    report = reader.tip_report()
    assert report is not None and report.past == 10
    assert report.carried is not None and seqs(report.carried) == [s for s, _ in recs[20:30]]
    big = {seq: b"x" * (CARRIED_BYTES_PER_SHARD // 5) for seq, _ in recs[20:30]}
    fake = TimedFake({"a": FakeShard(recs, payloads=big)})
    reader = RangeReader(fake, rng, 100)
    list(reader.pages())
    report = reader.tip_report()
    assert report is not None and report.past == 10 and report.carried is None


def test_carried_records_cross_the_wire_as_getrecords_gives_them():
    recs = log_of(4)
    past = records(recs[1:])
    past[1] = {k: v for k, v in past[1].items() if k != "PartitionKey"}  # a record written without one
    past[2]["Data"] = bytes(range(256))
    tip = TipReport(A, recs[3][0], 0, "it", {}, recs[0][0], 3, carried=tuple(past))
    _, (back,) = decode(encode("t", [tip]))
    assert back == tip
    for bad, word in (
        ([{"seq": "1", "data": "not base64!"}], "base64"),
        ([{"seq": "x1", "data": ""}], "sequence number"),
        ([{"seq": "1", "data": "", "key": 5}], "partition key"),
        ([{"seq": "1", "data": "", "at": "noon"}], "arrival"),
        ({"seq": "1"}, "list"),
    ):
        with pytest.raises(ValueError, match=word):
            TipReport.from_json({"shard": "s/a", "seq": "12", "behindMs": 0, "carried": bad})
    # a task's message keeps carried records up to its budget, the first shards first
    share = CARRIED_BYTES_PER_MESSAGE // 3 + 1
    one = dataclasses.replace(tip, carried=({"SequenceNumber": "5", "Data": b"x" * share},))
    kept = within_carry_budget([one, one, one])
    assert [t.carried is not None for t in kept] == [True, True, False]
    # the budget is the line's bytes, not the data's: tiny records with long keys (escaped in
    # JSON when not ASCII) count as such
    tiny = tuple({"SequenceNumber": str(10**55 + i), "Data": b"x", "PartitionKey": "\u00e9" * 256,
                  "ApproximateArrivalTimestamp": datetime.now(timezone.utc)} for i in range(200))
    bare = dataclasses.replace(tip, carried=None)
    assert len(encode("t", [dataclasses.replace(tip, carried=tiny)])) - len(encode("t", [bare])) <= carried_size(tiny)
    many = [dataclasses.replace(tip, carried=tiny) for _ in range(40)]
    kept = within_carry_budget(many)
    assert 0 < sum(t.carried is not None for t in kept) < 40
    assert len(encode("t", kept)) <= MAX_MESSAGE_BYTES


def test_only_a_shard_whose_ranges_are_carried_whole_lets_probes_spend_the_executors_share():
    budget = CallBudget({GET_RECORDS: 2.0})
    for key in (A, ShardId("s", "b")):
        budget.shards.state(key).read_booked = True  # (as book_read sets it: before, no reserve)
    assert budget.reserve(GET_RECORDS, A) == 1
    budget.shards.state(A).carried_whole = True  # (as TipTable.carry sets it)
    assert budget.reserve(GET_RECORDS, A) == 0 and budget.reserve(GET_RECORDS, ShardId("s", "b")) == 1
    budget.shards.state(A).carried_whole = False
    assert budget.reserve(GET_RECORDS, A) == 1


def test_fan_out_keeps_no_run():
    """With ``consumerMode=efo`` ranges are read by subscriptions, never carried: the probes'
    records are not kept on the driver (they would pile up to the run's cap on every shard)."""
    recs = log_of(20)
    fake = TimedFake({"a": FakeShard(recs[:10])})
    planner = reporting_planner(fake, consumerMode="efo")
    try:
        end = planner.latest_offset(trim_horizon(A))
        fake.shards["a"].records.extend(recs[10:15])
        wait_for(lambda: planner.latest_offset(end).shards[A] == Position.after(recs[14][0]),
                 timeout=10, what="the probe's new tip")
        assert planner.parts.tips.entries[A].run is None
    finally:
        planner.close()


def test_a_runs_iterator_too_old_to_hand_to_an_executor_is_not_handed_out():
    """Issue 46: a carried run's iterator older than an executor can still use (Kinesis ends
    iterators after 5 minutes) made the read's GetShardIterator an unbooked call after the
    expiry. Past ``HANDED_ITERATOR_TTL_S`` the run hands out its records only, and the read
    books its iterator."""
    import time

    from kinesis_source.aws.kinesis import HANDED_ITERATOR_TTL_S

    records = [{"SequenceNumber": str(n), "Data": b"x", "PartitionKey": "k"} for n in (2, 3)]
    fresh = CarriedRun("1", records, "it-after-3")
    assert fresh.take("5")[2] == "it-after-3"
    old = CarriedRun("1", records, "it-after-3", iterator_at=time.monotonic() - HANDED_ITERATOR_TTL_S - 1)
    taken, whole, iterator, _ = old.take("5")
    assert [r["SequenceNumber"] for r in taken] == ["2", "3"] and not whole and iterator is None
    # extending a run with no new iterator keeps the old one's age; a new iterator is fresh
    assert old.extended("3", [], None, 1 << 20).take("5")[2] is None
    assert old.extended("3", [], "it-new", 1 << 20).take("5")[2] == "it-new"


def test_a_run_from_a_position_without_a_record_serves_only_a_range_from_there():
    """The driver's fan-out subscription opened at TRIM_HORIZON (or a timestamp) received the
    records after that position: the run serves the range that starts there, and after the
    range, the one that starts after its end; nothing else."""
    from kinesis_source.driver.feeds import holdable, new_run

    recs = log_of(10)
    run = new_run(Position.trim_horizon())
    assert run.starts(Position.trim_horizon()) and not run.starts(Position.after(recs[0][0]))
    assert run.last == "" and run.size == 0
    run.append(records(recs[:6]))
    assert seqs(run.records) == [s for s, _ in recs[:6]] and run.size > 0
    taken, whole, _, rest = run.take(recs[3][0])
    assert whole and seqs(taken) == [s for s, _ in recs[:4]]
    assert rest is not None and rest.starts(Position.after(recs[3][0])) and not rest.starts(Position.trim_horizon())
    after = new_run(Position.after(recs[2][0]))
    assert after.starts(Position.after(recs[2][0])) and after.last == recs[2][0]
    # a start inside an aggregate (read limits cut there) is not held: its range reads the rest
    # of that aggregate, which no subscription opened after it returns
    assert not holdable(Position.after(recs[2][0], 3)) and holdable(Position.after(recs[2][0]))


def test_a_range_from_trim_horizon_carried_whole_is_read_with_no_call():
    recs = log_of(10)
    fake = TimedFake({"a": FakeShard(recs)})
    rng = ShardRange("s", "a", Position.trim_horizon(), recs[4][0])
    reader = RangeReader(fake, rng, 100, carried=tuple(records(recs[:5])))
    assert [s for page in reader.pages() for s in seqs(page)] == [s for s, _ in recs[:5]]
    assert fake.calls == [] and reader.tip_report() is None
