"""The per-shard call budget's windows and the driver's paced calls."""

from __future__ import annotations

import asyncio
import time

import pytest

from kinesis_source.aws.kinesis import ARRIVAL_MARGIN_S as M
from kinesis_source.aws.kinesis import AsyncKinesis
from kinesis_source.driver.budget import GET_RECORDS, GET_SHARD_ITERATOR, ByteBudget, CallBudget, PacedKinesis
from kinesis_source.driver.probe import TailProber
from kinesis_source.driver.shards import ShardStates
from kinesis_source.positions import Position, ShardId
from kinesis_source.read_rate import MIB, SHARD_BURST_BYTES, RateState
from tests.unit.fake_kinesis import AsyncFake, FakeKinesis, FakeShard, log_of


def greedy(budget: CallBudget, op: str, seconds: float) -> list[float]:
    """The times of calls on one shard made whenever the budget has room, every 10 ms."""
    made = []
    t = 0.0
    while t < seconds:
        if budget.room("a", op, t) > 0:
            budget.spend("a", op, 1, t)
            made.append(t)
        t += 0.01
    return made


def test_a_rate_holds_in_every_window_longer_than_a_second():
    """2/s is kept as 2 calls in any second, so 10 s hold at most 20 whatever the timing."""
    made = greedy(CallBudget({GET_RECORDS: 2.0}), GET_RECORDS, 10.0)
    assert len(made) == 20
    assert all(sum(1 for m in made if s <= m < s + 1.0) <= 2 for s in made)


def test_a_rate_of_one_keeps_a_burst_of_two_and_a_slower_rate_single_calls():
    """1 a second is "2 calls in any 2 s": two at once (a first look's two iterators), 10 in any
    10 s. Below 1 a second a window keeps one call (two would put more than the rate in 10 s):
    0.5 a second spreads single calls 2 s apart."""
    budget = CallBudget({GET_SHARD_ITERATOR: 0.5})
    budget.spend("a", GET_SHARD_ITERATOR, 1, 100.0)
    assert budget.free_at("a", GET_SHARD_ITERATOR, 0, 100.5) == 102.0 + M
    assert budget.room("a", GET_SHARD_ITERATOR, 102.0) == 0  # the margin for the way to the server
    assert budget.room("a", GET_SHARD_ITERATOR, 102.0 + M) == 1
    for rate in (0.3, 0.5, 0.9):
        made = greedy(CallBudget({GET_SHARD_ITERATOR: rate}), GET_SHARD_ITERATOR, 30.0)
        assert all(sum(1 for m in made if s <= m < s + 10.0) <= 10 * rate for s in made), (rate, made)
    made = greedy(CallBudget({GET_SHARD_ITERATOR: 1.0}), GET_SHARD_ITERATOR, 20.0)
    assert made[1] - made[0] < 0.05 and len(made) <= 20
    assert all(sum(1 for m in made if s <= m < s + 1.0) <= 2 for s in made)
    assert all(sum(1 for m in made if s <= m < s + 10.0) <= 10 for s in made)


def test_shards_have_their_own_windows_and_the_driver_leaves_the_reserve():
    budget = CallBudget({GET_RECORDS: 2.0})
    budget.spend("a", GET_RECORDS, 1, 0.0)
    assert budget.room("b", GET_RECORDS, 0.0) == 2
    # with one call in the window, a driver call (keeping 1 for an executor read) waits for it
    assert budget.reserve(GET_RECORDS) == 1
    assert budget.free_at("a", GET_RECORDS, keep=1, now=0.5) == 1.0 + M
    assert budget.free_at("a", GET_RECORDS, keep=0, now=0.5) == 0.5


def read_once(budget: CallBudget, key: ShardId) -> None:
    """An executor read of ``key`` booked long ago: from then on the driver keeps to its share
    of the shard's windows."""
    budget.book_read(key, False, time.monotonic() - 10.0)


def test_paced_calls_on_one_shard_keep_to_the_driver_share():
    """Driver calls on one shard: one per second (half of 2/s), the rest left to executors;
    every GetRecords names its shard."""
    fake = FakeKinesis({"a": FakeShard(log_of(5)), "b": FakeShard(log_of(5))})
    budget = CallBudget({GET_RECORDS: 20.0, GET_SHARD_ITERATOR: 10.0})
    kinesis = PacedKinesis(AsyncFake(fake), budget)
    read_once(budget, ShardId("s", "a"))

    async def run():
        it = await kinesis.iterator("s", "a", Position.trim_horizon())
        for _ in range(25):
            page = await kinesis.page("s", "a", it, 1)
            it = page.next_iterator or it
        await kinesis.iterator("s", "b", Position.trim_horizon())

    loop = asyncio.new_event_loop()
    started = loop.time()
    loop.run_until_complete(run())
    took = loop.time() - started
    loop.close()
    # 25 GetRecords at 10 driver calls/s on shard a: the last waits for the third window
    assert took >= 2.0
    assert budget.spent[GET_RECORDS] == 25 + 1 and budget.spent[GET_SHARD_ITERATOR] == 2  # (+ the read)
    assert isinstance(kinesis, AsyncKinesis)


def test_a_read_that_started_late_moves_its_booking_to_when_it_called():
    """An executor read booked at t=0 called at t=0.4 (its task started late): once its
    actual time replaces the booking, a driver call that leaves the read's share of a
    2-a-second budget fits at 1.4, not 1.0 (where the window would hold two calls 0.6 s apart)."""
    budget = CallBudget({GET_RECORDS: 2.0, GET_SHARD_ITERATOR: 1.0})
    at, booked = budget.book_read("s", False, now=100.0)
    assert at == 100.0 and booked == {GET_RECORDS: [100.0]}
    assert budget.free_at("s", GET_RECORDS, keep=1, now=100.0) == 101.0 + M
    budget.settle("s", GET_RECORDS, booked[GET_RECORDS], [100.4])
    assert budget.free_at("s", GET_RECORDS, keep=1, now=100.0) == 101.4 + M
    # a read that also paged on: both calls count, the second never booked
    budget.settle("s", GET_RECORDS, [], [101.5])
    assert budget.free_at("s", GET_RECORDS, keep=1, now=101.5) == 102.5 + M


def test_a_throttled_probe_is_tried_again_after_the_byte_models_wait():
    """The driver's GetRecords that the shard refuses: its model goes empty and learns of
    others; the retry waits for the model's refill (real seconds, so the figures are small)."""
    fake = FakeKinesis({"a": FakeShard(log_of(5))})
    budget = CallBudget({GET_RECORDS: 50.0, GET_SHARD_ITERATOR: 50.0})
    kinesis = PacedKinesis(AsyncFake(fake), budget, attempts=3)

    async def run():
        it = await kinesis.iterator("s", "a", Position.trim_horizon())
        await kinesis.page("s", "a", it, 1)  # the shard's record size is known from here on
        fake.throttle_next = 1
        return await kinesis.page("s", "a", it, 2)

    loop = asyncio.new_event_loop()
    page = loop.run_until_complete(run())
    loop.close()
    assert len(page.records) == 2
    assert fake.calls.count("GetRecords") == 3
    model = kinesis.byte_budget.model(ShardId("s", "a"))
    assert model.throttles == 1
    state = model.state(time.time())
    assert state.others > 0  # it learnt that others read the shard


def test_the_byte_model_goes_out_with_a_read_and_comes_back_with_its_report():
    ledger = ByteBudget(None, ShardStates())
    key = ShardId("s", "a")
    model = ledger.model(key)
    model.spend(3 * MIB, 1000, time.time())  # a probe's page
    handed = ledger.hand_out(key, 2000)
    assert handed.level == pytest.approx(SHARD_BURST_BYTES - 3 * MIB, abs=0.2 * MIB)
    assert handed.record_bytes == pytest.approx(3 * MIB / 1000)
    # the read's bytes are booked until it reports
    assert ledger.model(key).state(time.time()).level < handed.level - 5 * MIB
    reported = RateState(-MIB, time.time(), others=1000.0, record_bytes=500.0)
    ledger.adopt(key, reported)
    state = ledger.model(key).state(time.time())
    assert state.record_bytes == 500.0 and state.others == pytest.approx(1000.0, rel=0.01)
    assert state.level < 0.5 * MIB
    ledger.adopt(ShardId("s", "gone"), reported)  # a shard no longer planned: ignored
    ledger.forget(key)
    assert ledger.model(key).state(time.time()).level == SHARD_BURST_BYTES


def test_a_probe_that_waits_for_its_budget_reads_only_what_arrived_near_the_tip():
    """A busy shard's probe makes two GetRecords (its warm page, then a page at the tip) and the
    driver's share is one a second, so the page at the tip waits. Records arrive 200 a second
    all the while: the page reads what arrived near the tip after the wait, not the second's
    worth that arrived during it (the executors read those again). Mutant caught: the tip
    estimated before the wait (no ``ready``), which read 200-odd records."""
    shard = FakeShard([])
    fake = FakeKinesis({"a": shard})
    budget = CallBudget({GET_RECORDS: 2.0, GET_SHARD_ITERATOR: 1.0})
    kinesis = PacedKinesis(AsyncFake(fake), budget)
    prober = TailProber(kinesis, page_limit=10_000)
    prober.warm_bytes = 1  # a warm page of one record: the shard is busier than it reads

    def put(n: int) -> None:
        now = time.time()
        base = int(shard.records[-1][0]) + 1 if shard.records else 10**9
        shard.records += [(str(base + i), now) for i in range(n)]

    async def produce(stop: asyncio.Event) -> None:
        while not stop.is_set():
            put(1)
            await asyncio.sleep(0.005)  # the producer's pace, not a wait for a condition

    async def run():
        stop = asyncio.Event()
        producer = asyncio.create_task(produce(stop))
        await asyncio.sleep(0.5)  # records to probe
        first = await prober.probe("s", "a", Position.trim_horizon())
        await asyncio.sleep(0.5)  # new records after the tip
        fetched, waited = kinesis.records_fetched, kinesis.waited_s
        second = await prober.probe("s", "a", Position.after(first.tip))
        stop.set()
        await producer
        return second, kinesis.records_fetched - fetched, kinesis.waited_s - waited

    result, read, waited = asyncio.run(run())
    assert waited >= 0.5, f"the probe waited {waited:.2f} s: the scenario did not happen"
    assert result.tip is not None
    assert read <= 80, f"the probe read {read} records, {waited:.2f} s of them arrived while it waited"


def test_a_probe_that_waited_finds_the_tip_of_a_shard_nobody_writes_without_reading_its_backlog():
    """The other side of moving the estimate on by the wait: on a shard that got nothing since,
    the moved window is empty, and the probe looks where the first page said the tip was
    instead of widening the window until it reads the backlog. Mutant caught: no going back to
    the first estimate (the probe read all 5,000 records)."""
    shard = FakeShard(log_of(5000, start_time=time.time() - 60))
    fake = FakeKinesis({"a": shard})
    budget = CallBudget({GET_RECORDS: 2.0, GET_SHARD_ITERATOR: 1.0})
    read_once(budget, ShardId("s", "a"))
    kinesis = PacedKinesis(AsyncFake(fake), budget)
    prober = TailProber(kinesis, page_limit=10_000)
    prober.warm_bytes = 1  # a warm page of one record: the probe looks near the tip after it
    start = Position.after(shard.records[10][0])
    prober.keep("s", "a", start, fake.get_shard_iterator(
        StreamName="s", ShardId="a", ShardIteratorType="AFTER_SEQUENCE_NUMBER",
        StartingSequenceNumber=shard.records[10][0])["ShardIterator"])
    result = asyncio.run(prober.probe("s", "a", start))
    assert kinesis.waited_s >= 0.5, f"the probe waited {kinesis.waited_s:.2f} s: the scenario did not happen"
    assert result.tip == shard.records[-1][0]
    assert kinesis.records_fetched <= 20, kinesis.records_fetched


def test_a_first_probe_finds_the_tip_of_a_backlog_nobody_writes_to_in_its_second_call():
    """A query's first look at a shard (its start from TRIM_HORIZON, no iterator kept) has no
    sign that anyone writes to it: its page at the tip goes where the first page put the tip,
    not a wait further on. The backlog's tip is found there, in the probe's second
    GetShardIterator, not in a third after an empty moved window (a second more at the default
    budget: every query's start waited for it). Mutant caught: the window moved on a first
    look (3 GetShardIterator)."""
    shard = FakeShard(log_of(5000, start_time=time.time() - 60))
    fake = FakeKinesis({"a": shard})
    budget = CallBudget({GET_RECORDS: 2.0, GET_SHARD_ITERATOR: 1.0})
    read_once(budget, ShardId("s", "a"))  # (no wait before any read: the scenario is a later look)
    kinesis = PacedKinesis(AsyncFake(fake), budget)
    prober = TailProber(kinesis, page_limit=10_000)
    result = asyncio.run(prober.probe("s", "a", Position.trim_horizon()))
    assert kinesis.waited_s >= 0.5, f"the probe waited {kinesis.waited_s:.2f} s: the scenario did not happen"
    assert result.tip == shard.records[-1][0]
    assert fake.calls.count("GetShardIterator") == 2
    assert kinesis.records_fetched <= 20, kinesis.records_fetched


def test_a_first_look_that_stops_inside_the_last_batch_reads_on_one_warm_page():
    """A backlog's last ``PutRecords`` batch arrives in one millisecond: a look at the tip's
    arrival starts at the batch's first record, and a warm page may stop inside it, a few
    records short of the tip (``MillisBehindLatest`` 0, a full page). The probe reads on one
    more warm page from there and finds the tip: 2 GetShardIterator, 3 GetRecords. Mutant
    caught: no read-on (the moved windows after it cost more GetShardIterator: 4)."""
    records = log_of(2000, start_time=time.time() - 60)
    batch_at = records[-1][1]
    records[-15:] = [(seq, batch_at) for seq, _ in records[-15:]]  # one batch of 15 records
    shard = FakeShard(records)
    fake = FakeKinesis({"a": shard})
    budget = CallBudget({GET_RECORDS: 2.0, GET_SHARD_ITERATOR: 1.0})
    kinesis = PacedKinesis(AsyncFake(fake), budget)
    prober = TailProber(kinesis, page_limit=10_000)
    prober.warm_bytes = 10 * 12  # a warm page of ten records, by the first page's record ("d<seq>", 12 bytes)
    result = asyncio.run(prober.probe("s", "a", Position.trim_horizon()))
    assert result.tip == shard.records[-1][0]
    assert fake.calls.count("GetShardIterator") == 2, fake.calls
    assert fake.limits[1] < 15, f"the look's page ({fake.limits}) must stop inside the batch"
    assert fake.calls.count("GetRecords") == 3, fake.calls
    assert kinesis.records_fetched <= 1 + 2 * fake.limits[1], kinesis.records_fetched


def test_a_first_probe_of_a_busy_shard_reads_a_warm_page_then_near_the_tip():
    """The other side: on a first look at a shard written to all the while, the page where the
    first page put the tip holds more than a warm page (what arrived during the wait), so the
    probe goes on with the window moved on by the wait, reading little of the second's worth
    the executors read anyway."""
    shard = FakeShard([])
    fake = FakeKinesis({"a": shard})
    budget = CallBudget({GET_RECORDS: 2.0, GET_SHARD_ITERATOR: 1.0})
    read_once(budget, ShardId("s", "a"))  # (no wait before any read: the scenario is a later look)
    kinesis = PacedKinesis(AsyncFake(fake), budget)
    prober = TailProber(kinesis, page_limit=10_000)
    prober.warm_bytes = 10 * 10  # a warm page of ten records (of "d<seq>", 10 bytes each)

    async def run():
        stop = asyncio.Event()

        async def produce() -> None:
            while not stop.is_set():
                base = int(shard.records[-1][0]) + 1 if shard.records else 10**9
                shard.records.append((str(base), time.time()))
                await asyncio.sleep(0.005)  # the producer's pace, not a wait for a condition

        producer = asyncio.create_task(produce())
        await asyncio.sleep(0.5)  # records to probe
        result = await prober.probe("s", "a", Position.trim_horizon())
        stop.set()
        await producer
        return result

    result = asyncio.run(run())
    assert kinesis.waited_s >= 0.5, f"the probe waited {kinesis.waited_s:.2f} s: the scenario did not happen"
    assert result.tip is not None and int(result.tip) > 10**9 + 150
    assert kinesis.records_fetched <= 1 + 10 + 80, kinesis.records_fetched


def test_a_first_probes_iterator_opens_the_read_of_the_range_from_its_start():
    """The first probe of a shard opens an iterator at the query's start (TRIM_HORIZON, a
    timestamp) and reads its first record: the read of the range from that start gets the
    iterator and that record (``opener``), and needs no GetShardIterator of its own. An
    ``AFTER`` start opens at the record before it (to see that it is still there): that
    iterator does not start the range and is not handed on."""
    recs = log_of(50, start_time=time.time() - 60)
    fake = FakeKinesis({"a": FakeShard(recs)})
    kinesis = PacedKinesis(AsyncFake(fake), CallBudget({GET_RECORDS: 5.0, GET_SHARD_ITERATOR: 5.0}))
    prober = TailProber(kinesis, page_limit=10_000)
    key = ShardId("s", "a")
    asyncio.run(prober.probe("s", "a", Position.trim_horizon()))
    iterator, first = prober.opener(key, Position.trim_horizon())
    assert first == recs[0][0]
    assert fake.get_records(ShardIterator=iterator, Limit=1)["Records"][0]["SequenceNumber"] == recs[0][0]
    after = Position.after(recs[10][0])
    asyncio.run(prober.probe("s", "a", after))
    assert prober.opener(key, after) is None


def test_every_getrecords_of_a_probe_over_a_sparse_shard_is_paced_and_names_its_stream():
    """Issue 46 item 2: a probe that crosses many empty pages (a sparse shard, as real Kinesis
    serves it) and widens its window over and over read its last pages on iterators that a
    16-a-shard ledger had forgotten: unpaced, on a shared byte model, without ``StreamARN``
    (fails on 6e29bff: calls without the ARN, and more in one second than the driver's share).
    Every call names its shard now."""
    recs = log_of(3, spacing=100.0)
    fake = FakeKinesis({"a": FakeShard(recs, gaps={1: 25, 2: 25})})
    budget = CallBudget({GET_RECORDS: 20.0, GET_SHARD_ITERATOR: 20.0})
    arn = "arn:aws:kinesis:us-east-1:123456789012:stream/s"
    kinesis = PacedKinesis(AsyncFake(fake), budget, arns={"s": arn})
    prober = TailProber(kinesis, page_limit=10000)
    # a read of the shard was booked once, so the driver keeps to its share (before any, its
    # first looks may take the whole window: test_a_shard_never_read_lends_the_driver_its_whole_window)
    read_once(budget, ShardId("s", "a"))
    result = asyncio.run(prober.probe("s", "a", Position.trim_horizon()))
    log = fake.get_records_log
    assert result.tip in {s for s, _ in recs} and len(log) > 16
    assert [a for _, _, a in log if a != arn] == [], "every GetRecords names the stream by its ARN"
    assert budget.spent[GET_RECORDS] == len(log) + 1, "every GetRecords spent its shard's budget"
    times = [t for _, t, _ in log]
    # the driver's share is half of 20 calls a second (the rest is kept for executor reads)
    worst = max(sum(1 for u in times if t <= u < t + 1.0) for t in times)
    assert worst <= 10, f"{worst} GetRecords within one second"


def test_a_shard_never_read_lends_the_driver_its_whole_window():
    """Issue 51 item 4: until a read of a shard is booked, no read waits for its window, so the
    driver's first looks (an AvailableNow target, LATEST, a first answer) may use all of it; once
    one is booked the driver keeps half for the executors again, and every window holds at most
    the budget."""
    budget = CallBudget({GET_RECORDS: 2.0, GET_SHARD_ITERATOR: 1.0})
    key = ShardId("s", "a")
    assert budget.reserve(GET_RECORDS, key) == 0
    now = time.monotonic()
    budget.spend(key, GET_RECORDS, now=now)
    assert budget.free_at(key, GET_RECORDS, budget.reserve(GET_RECORDS, key), now) == now
    budget.spend(key, GET_RECORDS, now=now)
    at, booked = budget.book_read(key, False, now)
    assert at > now + 1.0, "the read's call waits until the window has room"
    assert budget.reserve(GET_RECORDS, key) == 1
    assert budget.free_at(key, GET_RECORDS, budget.reserve(GET_RECORDS, key), now) > at


def test_a_first_look_at_a_shard_no_read_waits_for_finds_its_tip_without_waiting():
    """Issue 51 item 4: a query's first look at a backlog (its start's iterator and first
    record, then an iterator and a page at the estimated tip) at the default budget: before,
    the second GetShardIterator and GetRecords waited a second for the windows (an AvailableNow
    target, LATEST and every first answer took that second); now the 1-a-second iterator budget
    holds a burst of two and no read of the shard waits for the GetRecords window, so the tip is
    found at once, within the budgets."""
    shard = FakeShard(log_of(5000, start_time=time.time() - 60))
    fake = FakeKinesis({"a": shard})
    budget = CallBudget({GET_RECORDS: 2.0, GET_SHARD_ITERATOR: 1.0})
    kinesis = PacedKinesis(AsyncFake(fake), budget)
    prober = TailProber(kinesis, page_limit=10_000)
    result = asyncio.run(prober.probe("s", "a", Position.trim_horizon()))
    assert result.tip == shard.records[-1][0]
    assert kinesis.waited_s < 0.2, kinesis.waited_s
    assert fake.calls.count("GetShardIterator") == 2 and budget.spent[GET_RECORDS] <= 2
    # the executor read booked next waits for the GetRecords window the look used
    at, _ = budget.book_read(ShardId("s", "a"), False, time.monotonic())
    assert at > time.monotonic() + 0.5


def test_free_at_ends_where_float_rounding_keeps_an_event_inside_its_own_window():
    """An audit found ``free_at`` spinning for ever (under the planning lock) when
    ``(t + span) - span`` comes out below ``t``: the next try must always be later."""
    budget = CallBudget({GET_RECORDS: 2.0})
    t = 65535.58205280548
    budget.spend("a", GET_RECORDS, 2, t)
    assert budget.free_at("a", GET_RECORDS, 0, t + 0.1) >= t + 1.0
    made = greedy(CallBudget({GET_RECORDS: 0.5}), GET_RECORDS, 30.0)
    assert len(made) >= 10
