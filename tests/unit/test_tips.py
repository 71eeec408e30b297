"""The tip table: latestOffset answers from it, the background keeps it fresh on a schedule."""

from __future__ import annotations

import itertools
import time

from botocore.exceptions import ClientError

from kinesis_source.aws.kinesis import AsyncKinesis
from kinesis_source.driver.planner import Planner
from kinesis_source.driver.tips import ShardTip
from kinesis_source.options import SourceOptions
from kinesis_source.positions import Offset, Position, ShardId
from tests.support.waiting import wait_for
from tests.unit.fake_kinesis import AsyncFake, FakeKinesis, FakeShard, log_of

A, B = ShardId("s", "a"), ShardId("s", "b")


class TimedFake(FakeKinesis):
    """Also records when each GetRecords came, per shard (from the iterator's shard part)."""

    def __init__(self, shards):
        super().__init__(shards)
        self.reads: list[tuple[str, float]] = []

    def get_records(self, ShardIterator, Limit):
        self.reads.append((ShardIterator.split("|", 1)[0], time.monotonic()))
        return super().get_records(ShardIterator, Limit)


def planner_on(fake, **options):
    raw = {"streamName": "s", "applicationName": "app", "region": "us-east-1", **options}
    return Planner(SourceOptions.parse(raw), AsyncKinesis(AsyncFake(fake)))


def trim_horizon(*sids):
    return Offset({sid: Position.trim_horizon() for sid in sids})


def test_latest_offset_answers_from_the_table_without_calls():
    recs = log_of(20)
    fake = TimedFake({"a": FakeShard(recs[:10]), "b": FakeShard(recs[10:])})
    planner = planner_on(fake, minProbeIntervalMs="3600000", maxIdleProbeIntervalMs="3600000")
    try:
        start = trim_horizon(A, B)
        end = planner.latest_offset(start)  # the first answer waits for the first probes
        assert end.shards == {A: Position.after(recs[9][0]), B: Position.after(recs[19][0])}
        calls = len(fake.calls)
        for _ in range(5):
            assert planner.latest_offset(start) == end
            assert planner.latest_offset(end) == end
        assert len(fake.calls) == calls
    finally:
        planner.close()


def test_records_that_arrive_later_are_found_by_the_background():
    recs = log_of(20)
    fake = TimedFake({"a": FakeShard(recs[:10])})
    planner = planner_on(fake, minProbeIntervalMs="50", maxIdleProbeIntervalMs="100")
    try:
        first = planner.latest_offset(trim_horizon(A))
        fake.shards["a"].records.extend((seq, t + 0.5) for seq, t in recs[10:])
        wait_for(lambda: planner.latest_offset(first) != first, timeout=10, what="the new tip")
        assert planner.latest_offset(first).shards[A] == Position.after(recs[19][0])
    finally:
        planner.close()


def test_an_idle_shard_is_probed_less_and_less_often_down_to_the_bound():
    fake = TimedFake({"a": FakeShard(log_of(3))})
    planner = planner_on(fake, minProbeIntervalMs="20", maxIdleProbeIntervalMs="300",
                         getRecordsPerShardPerSecond="5")
    try:
        planner.latest_offset(trim_horizon(A))
        wait_for(lambda: len(fake.reads) >= 9, timeout=20, what="nine probes of the idle shard")
    finally:
        planner.close()
    gaps = [b - a for (_, a), (_, b) in itertools.pairwise(fake.reads)]
    # 20, 40, 80, 160 ms, then never less than the 300 ms bound (jitter only stretches it)
    assert all(g >= 0.3 for g in gaps[-3:]), gaps
    assert gaps[1] < 0.3


def test_a_closed_shard_is_probed_until_its_end_and_then_no_more():
    recs = log_of(4)
    fake = TimedFake({"a": FakeShard(recs, closed=True), "b": FakeShard()})
    planner = planner_on(fake, minProbeIntervalMs="10", maxIdleProbeIntervalMs="10",
                         getRecordsPerShardPerSecond="5")
    try:
        end = planner.latest_offset(trim_horizon(A, B))
        assert end.shards[A] == Position.after(recs[-1][0])
        wait_for(lambda: planner.latest_offset(end).shards.get(A) == Position.shard_end(),
                 timeout=10, what="SHARD_END")
        reads_of_a = sum(1 for shard, _ in fake.reads if shard == "a")
        b_before = sum(1 for shard, _ in fake.reads if shard == "b")
        # the open shard beside it is probed every 10 ms meanwhile; the closed one never again
        wait_for(lambda: sum(1 for shard, _ in fake.reads if shard == "b") >= b_before + 10,
                 timeout=20, what="ten more probes of the open shard")
        assert sum(1 for shard, _ in fake.reads if shard == "a") == reads_of_a
    finally:
        planner.close()


def test_an_answer_never_goes_before_the_start_it_is_asked_for():
    entry = ShardTip(seed=Position.after("100"), tip="300")
    assert entry.covers(Position.after("200"))
    assert entry.answer(Position.after("200"), None).tip == "300"
    assert entry.answer(Position.after("300"), None).tip is None
    assert entry.answer(Position.at("300"), None).tip == "300"  # AT includes the record
    assert entry.answer(Position.after("200"), "250").tip == "250"  # capped (AvailableNow)
    assert not entry.covers(Position.after("400"))  # the table is behind: it must reseed
    assert not entry.covers(Position.trim_horizon())


class ThrottlingFake(TimedFake):
    """Refuses the next ``throttle`` GetRecords as Kinesis does when the shard's quota is spent."""

    throttle = 0

    def get_records(self, ShardIterator, Limit):
        if self.throttle:
            self.throttle -= 1
            raise ClientError({"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "x"}},
                              "GetRecords")
        return super().get_records(ShardIterator, Limit)


def test_a_probe_throttled_beyond_retries_slows_the_query_and_never_fails_it(monkeypatch):
    monkeypatch.setattr("kinesis_source.driver.probe_rounds.THROTTLED_PAUSE_S", 0.05)
    recs = log_of(6)
    fake = ThrottlingFake({"a": FakeShard(recs)})
    fake.throttle = 3
    planner = planner_on(fake, minProbeIntervalMs="10", maxIdleProbeIntervalMs="10")
    try:
        start = trim_horizon(A)
        assert planner.latest_offset(start) == start  # nothing known yet, and no error
        wait_for(lambda: planner.latest_offset(start).shards[A] == Position.after(recs[-1][0]),
                 timeout=10, what="the tip once the quota is free again")
        assert fake.throttle == 0
    finally:
        planner.close()


def test_answers_patched_from_the_last_one_equal_the_full_computation(monkeypatch):
    """``latestOffset`` re-answers only the shards that changed (``driver/answers.py``); at
    every step of a random run (records arriving on some shards, a shard closing, Spark asking
    again from the same start or going on from the last end) the patched answer, and its JSON,
    must be what the full computation from the listing and the whole table gives, and so must
    the lag shown in the progress report."""
    import random

    from kinesis_source.driver.answers import LastAnswer

    patched = []
    real_patch = LastAnswer.patch

    def counting(self, *args):
        out = real_patch(self, *args)
        patched.append(out is not None)
        return out

    monkeypatch.setattr(LastAnswer, "patch", counting)
    rng = random.Random(7)
    names = [f"shard-{i:02d}" for i in range(12)]
    recs = log_of(4000)
    feed = iter(recs)
    fake = TimedFake({n: FakeShard([next(feed)]) for n in names})
    planner = planner_on(fake, minProbeIntervalMs="5", maxIdleProbeIntervalMs="20",
                         getRecordsPerShardPerSecond="5", failOnDataLoss="false")

    async def patched_then_full(start):
        latest = planner.parts.latest
        assert latest is not None
        fast = latest.patched(start, None) or await latest.full(start, None)
        fast_lag, kept = planner.stats()["shards"], latest.last
        latest.last = None
        full = await latest.full(start, None)
        assert fast_lag == planner.stats()["shards"], "the progress report's lag differs"
        latest.last = kept
        return fast, full

    try:
        start = trim_horizon(*(ShardId("s", n) for n in names))
        end = planner.latest_offset(start)
        closed = False
        for step in range(150):
            for name in rng.sample(names, rng.randint(0, 4)):
                if not fake.shards[name].closed:
                    seq, at = next(feed)
                    fake.shards[name].records.append((seq, at))
            if step == 60 and not closed:
                fake.shards[names[3]].closed = closed = True
            time.sleep(rng.choice((0.0, 0.01, 0.03)))
            if rng.random() < 0.7:
                start = end  # Spark ran the batch: the next start is the last end
            fast, full = planner._loop.run(patched_then_full(start))
            assert fast == full, f"step {step}"
            assert fast.to_dict() == Offset(dict(fast.shards)).to_dict(), f"step {step}"
            end = fast
    finally:
        planner.close()
    assert sum(patched) > 50, f"only {sum(patched)} of {len(patched)} answers were patched"


def test_closing_stops_the_probes_in_flight():
    """A probe still waiting on AWS when the planner closes is cancelled with the table, not
    left pending on a closed loop."""
    import asyncio

    recs = log_of(4)
    fake = TimedFake({"a": FakeShard(recs)})
    planner = planner_on(fake, minProbeIntervalMs="10", maxIdleProbeIntervalMs="10",
                         getRecordsPerShardPerSecond="5")
    planner.latest_offset(trim_horizon(A))
    started = []

    async def stuck(*_args, **_kw):
        started.append(1)
        await asyncio.sleep(3600)

    planner.parts.prober.probe = stuck  # the next probe hangs, as on a dead connection
    wait_for(lambda: started, timeout=10, what="a probe in flight")
    pending = []

    async def probes_left():
        pending.extend(t for t in asyncio.all_tasks() if "_probe" in repr(t.get_coro()))

    planner._loop.run(probes_left())
    assert pending, "expected a probe task in flight"
    planner.close()
    assert all(t.done() for t in pending)


def test_new_records_wait_for_the_read_budget_in_the_table_not_in_a_sleeping_task():
    """With one GetRecords a second for the shard, the driver's probe and the executor's read
    take turns. A batch takes the shard's new records only once its read can start at once:
    the executor never sleeps inside its task waiting for the budget (which would hold a task
    slot and stretch the batch)."""
    from kinesis_source.driver.budget import PacedKinesis
    from kinesis_source.driver.planner import plan_ranges

    recs = log_of(20)
    shard = FakeShard()
    fake = TimedFake({"a": shard})
    planner = planner_on(fake, minProbeIntervalMs="20", maxIdleProbeIntervalMs="40",
                         getRecordsPerShardPerSecond="1", tipReports="false")  # no executor reports here
    # the driver's calls count too
    planner._kinesis = PacedKinesis(AsyncFake(fake), planner.budget, planner.byte_budget)
    try:
        start = trim_horizon(A)
        # A run's first answer holds nothing back (it may be a Trigger.Once run's only batch):
        # this one finds no records; the holds under test are those of the answers after it.
        assert planner.latest_offset(start) == start
        for more in (recs[:10], recs[10:20]):
            shard.records.extend(more)
            end = wait_for(lambda s=start: (e := planner.latest_offset(s)) != s and e, timeout=10,
                           what="the new records in a batch")
            assert end.shards[A] == Position.after(more[-1][0])
            booked, _ = planner.hand_over(plan_ranges(start, end))
            assert booked[A][1] - time.time() <= 0.1, "the read was planned before it could start"
            start = end
    finally:
        planner.close()


def test_new_records_wait_in_the_table_while_the_shards_bytes_are_spent():
    """A read that took the shard's bytes (its report said so): the next batch takes the shard's
    new records only once the byte model holds a page's worth again, not into a task that
    would sleep for the refill. (The new records are larger than the probe reads on from its
    tip, so the executor must read them: a range the driver carries needs no bytes.)"""
    from kinesis_source.read_rate import MIB, SHARD_BYTES_PER_S, RateState

    recs = log_of(20)
    shard = FakeShard(recs[:10], payloads={seq: b"x" * 100_000 for seq, _ in recs[10:]})
    fake = TimedFake({"a": shard})
    planner = planner_on(fake, minProbeIntervalMs="20", maxIdleProbeIntervalMs="40", tipReports="false")
    try:
        start = trim_horizon(A)
        end = planner.latest_offset(start)
        assert end.shards[A] == Position.after(recs[9][0])
        # the read of that batch left the bucket overdrawn by 1.5 s of refill (and a page short)
        planner.byte_budget.model(A)
        planner.byte_budget.adopt(A, RateState(-1.5 * SHARD_BYTES_PER_S, time.time(), record_bytes=MIB / 10))
        shard.records.extend(recs[10:])
        held_since = time.monotonic()
        later = wait_for(lambda: (e := planner.latest_offset(end)) != end and e, timeout=10,
                         what="the new records in a batch")
        assert later.shards[A] == Position.after(recs[19][0])
        assert time.monotonic() - held_since >= 1.5  # held while the model refilled
        assert planner.byte_budget.wait_s(A, 1.0) <= 0.1  # and planned once a page fitted
    finally:
        planner.close()
