"""The model of a shard's byte budget (read_rate.py), on a simulated clock against a bucket that
answers as Kinesis' does (2 MiB/s, 10 MiB deep, a response may overdraw it, calls refused while
it is empty)."""

from __future__ import annotations

import random

import pytest

from kinesis_source.executor.gate import PAGE_JITTER
from kinesis_source.read_rate import (
    CAP_BURST_S,
    LEAD_BUILD_S,
    LEARN_OVERSHOOT,
    LEARN_STEP_SHARE,
    MARGIN_BYTES,
    MIB,
    OTHERS_HALF_LIFE_S,
    OTHERS_HOLD_S,
    SHARD_BURST_BYTES,
    SHARD_BYTES_PER_S,
    RateState,
    ShardBytes,
)

RECORD = 1024 + 10  # data and partition key of a 1 KB record


class KinesisBucket:
    """The server's side, as the quota proxy of tests/support/quota.py keeps it."""

    def __init__(self) -> None:
        self.tokens, self.at = float(SHARD_BURST_BYTES), 0.0

    def level(self, now: float) -> float:
        self.tokens = min(SHARD_BURST_BYTES, self.tokens + (now - self.at) * SHARD_BYTES_PER_S)
        self.at = now
        return self.tokens


def catch_up(backlog_records: int, cap: float | None = None, interval: float = 1.0,
             record_bytes: float | None = None, first_interval: float | None = None,
             build_s_per_mib: float = 0.0, lead: bool = False):
    """A reader with the model reading a backlog, paced as ``ShardGate._pace`` paces (without
    its jitter): (seconds from the first to the last call with data, bytes read after the first
    call, refused calls, calls). Calls are ``first_interval`` apart up to the second, then
    ``interval``. The server takes ``build_s_per_mib`` to build a page and charges it when built,
    as the quota proxy does (the reader's next call comes after the answer); ``lead``: the
    reader asks for a lead page, as a read of more than a bucket does."""
    first_interval = interval if first_interval is None else first_interval
    server, now, page = KinesisBucket(), 0.0, 10000
    model = ShardBytes(cap, RateState(SHARD_BURST_BYTES, 0.0, record_bytes=record_bytes), 0.0)
    left, refused, calls, times, after_first = backlog_records, 0, 0, [], 0

    def spacing(made: int) -> float:
        return interval if made >= 2 else first_interval

    while left:
        answered = now
        if server.level(now) <= 0:
            refused += 1
            model.refused(now)
        else:
            lead_s = spacing(calls + 1) * (1 + PAGE_JITTER) if lead else None
            n = min(left, model.limit(min(left, page), now, lead_s))
            answered = now + build_s_per_mib * n * RECORD / MIB
            server.level(answered)
            server.tokens -= n * RECORD
            model.spend(n * RECORD, n, answered)
            left -= n
            calls += 1
            if times:
                after_first += n * RECORD
            times.append(now)
        want = min(left, page) or 1
        wait = max(now + spacing(calls) - answered, model.wait_s(model.want_bytes(want, spacing(calls)), answered))
        if left < page and model.record_bytes is not None:
            wait = model.end_wait(left * model.record_bytes, wait, spacing(calls + 1), answered)
        now = answered + max(0.0, wait)
    return times[-1] - times[0], after_first, refused, calls


def test_a_backlog_is_read_at_the_shards_physical_limit_without_a_throttle():
    records = 30_000  # ~29.6 MiB
    window, _, refused, _ = catch_up(records)
    physical = (records * RECORD - SHARD_BURST_BYTES) / SHARD_BYTES_PER_S
    assert refused == 0
    assert window <= physical * 1.05  # the model's own arithmetic: one interval of slack at most


def test_a_large_read_from_a_full_bucket_leads_with_a_small_page_so_no_refill_is_lost():
    """Issue 20: the server charges a page when it has built it (moto: 0.074 s a MiB), and while
    it builds the first 10 MB page of a catch-up the full bucket's refill is lost: the read took
    that build time longer than the physical limit. A lead page is built at once and leaves the
    bucket room to refill while the large page after it is built."""
    records = 26 * MIB // RECORD
    physical = (records * RECORD - SHARD_BURST_BYTES) / SHARD_BYTES_PER_S
    build = 0.074
    kw = {"interval": 0.5, "first_interval": 1.0, "record_bytes": RECORD, "build_s_per_mib": build}
    blind, _, blind_refused, _ = catch_up(records, **kw)
    window, _, refused, _ = catch_up(records, lead=True, **kw)
    assert blind_refused == refused == 0
    assert blind >= physical + 0.9 * 10 * build  # the first page's build, lost
    lead_bytes = SHARD_BYTES_PER_S * (1.0 * (1 + PAGE_JITTER) + LEAD_BUILD_S)
    assert window <= physical + build * lead_bytes / MIB + 0.05  # only the lead page's build
    # Without a build time the lead page costs nothing either.
    assert catch_up(records, lead=True, interval=0.5, first_interval=1.0, record_bytes=RECORD)[0] <= physical + 0.05


def test_the_last_call_comes_when_the_rest_of_the_range_is_there():
    records = 26_000
    physical = (records * RECORD - SHARD_BURST_BYTES) / SHARD_BYTES_PER_S
    window, _, refused, _ = catch_up(records, interval=0.5, first_interval=1.0, record_bytes=RECORD)
    # Without it the last call waits for the call spacing after its bytes are there: 0.15 s here.
    assert refused == 0 and window <= physical + MARGIN_BYTES / SHARD_BYTES_PER_S + 0.01
    model = ShardBytes(None, RateState(0.0, 0.0, record_bytes=RECORD), 0.0)
    there_in = model.wait_s(MIB, 0.0)  # the rest, 1 MiB, is there in about half a second
    # before the next call could come: the call waits for all of it and reads it at once
    assert model.end_wait(MIB, 0.1, 0.5, 0.0) == there_in
    # before the call after: this call comes so that the next one comes when it is there
    assert model.end_wait(MIB, 0.1, 0.25, 0.0) == pytest.approx(there_in - 0.25)
    # later than that, or already there when the call comes: the wait stays
    assert model.end_wait(MIB, 0.1, 0.1, 0.0) == 0.1
    assert model.end_wait(MIB, 0.6, 0.5, 0.0) == 0.6


def test_a_cap_holds_the_rate_to_it():
    cap = 0.5 * MIB
    window, after_first, refused, _ = catch_up(6_000, cap=cap)
    assert refused == 0
    # the cap's bucket lets at most its depth more through than the cap's rate over a window
    assert after_first <= cap * window + cap * CAP_BURST_S
    assert after_first / window >= 0.9 * cap  # and is not wasted: a call takes what it holds


def test_the_limit_fits_what_the_bucket_holds_by_the_records_size():
    model = ShardBytes(None, RateState(3 * MIB, 0.0, record_bytes=1000.0), 0.0)
    assert model.limit(10000, 0.0) == int((3 * MIB - MARGIN_BYTES) // 1000)
    assert model.limit(5, 0.0) == 5
    empty = ShardBytes(None, RateState(-MIB, 0.0, record_bytes=1000.0), 0.0)
    assert empty.limit(10000, 0.0) == 1  # a call that happens asks for one record at least


def test_an_unknown_record_size_is_planned_as_the_largest_unless_the_bucket_is_full():
    full = ShardBytes(None, None, 0.0)
    assert full.limit(10000, 0.0) == 10000  # no response is larger than the full bucket
    half = ShardBytes(None, RateState(5 * MIB, 0.0), 0.0)
    assert half.limit(10000, 0.0) == 4  # 5 MiB less the margin holds four 1 MiB records


def test_the_wait_is_what_the_refill_needs():
    model = ShardBytes(None, RateState(0.0, 0.0, record_bytes=1000.0), 0.0)
    assert model.wait_s(MIB, 0.0) == pytest.approx((MIB + MARGIN_BYTES) / SHARD_BYTES_PER_S)
    assert model.wait_s(MIB, 10.0) == 0.0
    capped = ShardBytes(0.25 * MIB, RateState(0.0, 0.0, record_bytes=1000.0, cap_level=0.0), 0.0)
    # a wait never asks for more than the cap's bucket holds: CAP_BURST_S of the cap
    assert capped.wait_s(MIB, 0.0) == pytest.approx(CAP_BURST_S)


def test_a_refusal_teaches_what_others_read_and_keeps_it_free():
    # a model a refusal verified at 0 s: the 1 MiB it still had at 2 s was others' in those 2 s
    model = ShardBytes(None, RateState(-3 * MIB, 0.0, record_bytes=1000.0, learned_at=0.0), 0.0)
    model.refused(2.0)
    state = model.state(2.0)
    assert state.level == 0.0
    assert state.others == pytest.approx(LEARN_OVERSHOOT * (MIB - MARGIN_BYTES) / 2.0)
    # a model nobody verified (a bucket assumed full) learns at most an equal share: half the shard
    fresh = ShardBytes(None, RateState(SHARD_BURST_BYTES, 0.0, record_bytes=1000.0), 0.0)
    fresh.refused(0.5)
    assert fresh.state(0.5).others == pytest.approx(SHARD_BYTES_PER_S * LEARN_STEP_SHARE)
    assert state.learned_at == 2.0
    # others are assumed to go on: the refill is what they leave, and a second of it stays free
    model2 = ShardBytes(None, RateState(0.0, 0.0, others=MIB, record_bytes=1000.0), 0.0)
    wait = model2.wait_s(MIB, 0.0)
    assert wait == pytest.approx((MIB + MIB + MARGIN_BYTES) / (SHARD_BYTES_PER_S - MIB))


def test_others_fade_so_bandwidth_they_stop_using_comes_back():
    model = ShardBytes(None, RateState(0.0, 0.0, others=MIB, record_bytes=1000.0), 0.0)
    later = model.state(300.0)
    assert later.others == pytest.approx(MIB / 2)
    assert model.state(6000.0).others < MIB / 1000


def beside_a_neighbour(seconds: float, seed: int, record: int = 10_002):
    """The source's model reading a backlog (0.5 s apart plus up to a quarter more at random, as
    ``RangeReader`` paces) beside another application that takes 1 MiB once a second: (times the
    source was refused, times the neighbour was, the source's bytes/s after its first 10 s)."""
    rng = random.Random(seed)
    server = KinesisBucket()
    model = ShardBytes(None, RateState(SHARD_BURST_BYTES, 0.0, record_bytes=record), 0.0)
    theirs, ours = 0.3, 3.0  # the neighbour reads alone for a while first
    refused: tuple[list[float], list[float]] = ([], [])
    read = 0
    while min(theirs, ours) < seconds:
        if theirs <= ours:
            if server.level(theirs) <= 0:
                refused[1].append(theirs)
            else:
                server.tokens -= (MIB // record) * record
            theirs += 1.0
            continue
        now = ours
        if server.level(now) <= 0:
            refused[0].append(now)
            model.refused(now)
        else:
            n = model.limit(10000, now)
            server.tokens -= n * record
            model.spend(n * record, n, now)
            read += n * record if now > 13.0 else 0
        ours = now + max(0.5 * (1 + 0.25 * rng.random()), model.wait_s(model.want_bytes(10000, 0.5), now))
    return refused[0], refused[1], read / (seconds - 13.0)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_beside_a_steady_neighbour_the_source_is_refused_at_most_once_a_minute(seed):
    ours, theirs, rate = beside_a_neighbour(600.0, seed)
    # First contact teaches the model that someone else reads; the estimate is then held for
    # OTHERS_HOLD_S before it fades, so the next refusal (the fading found out) is over a minute
    # later. (Fading at once: every 48 s.)
    assert ours and ours[0] < 15.0
    assert all(b - a >= 60.0 for a, b in zip(ours, ours[1:], strict=False)), ours
    assert all(t < ours[0] + 1.0 for t in theirs), theirs  # the neighbour: only before we knew
    assert 0.95 * MIB <= rate <= 1.05 * MIB  # and the source takes the rest of the shard


def test_others_never_take_the_whole_shard():
    model = ShardBytes(None, RateState(SHARD_BURST_BYTES, 0.0, learned_at=0.0), 0.0)
    for t in range(1, 20):
        model.refused(float(t) + 0.001)
    assert model.state(20.0).others <= SHARD_BYTES_PER_S * 0.9


def test_a_state_survives_its_json_and_bad_ones_are_named():
    state = RateState(1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0)
    assert RateState.from_json(state.to_json()) == state
    assert RateState.from_json(RateState(1.0, 2.0).to_json()) == RateState(1.0, 2.0)
    with pytest.raises(ValueError, match="level"):
        RateState.from_json({"level": "x", "at": 1.0})
    with pytest.raises(ValueError, match="positive"):
        RateState.from_json({"level": 1.0, "at": 1.0, "others": -1.0})


def test_a_state_from_a_clock_ahead_is_taken_as_of_now():
    model = ShardBytes(None, RateState(0.0, 100.0, record_bytes=1000.0), 50.0)
    assert model.state(50.0).at == 50.0
    assert model.available(51.0) == pytest.approx(SHARD_BYTES_PER_S - MARGIN_BYTES)


def test_a_refusal_after_a_page_counts_the_page_as_a_possible_overdraft():
    """The bucket is empty, maybe overdrawn by this reader's last page: the next call waits
    that debt out too (and a verified refusal then learns others' rate, not this debt)."""
    model = ShardBytes(None, RateState(3 * MIB, 0.0, record_bytes=1000.0), 0.0)
    model.spend(2 * MIB, 2000, 0.0)
    model.refused(0.5)
    others = SHARD_BYTES_PER_S * LEARN_STEP_SHARE  # the first refusal: an equal share
    assert model.state(0.5).level == pytest.approx(-2 * MIB)
    expected = (2 * MIB + MIB + MARGIN_BYTES + others) / (SHARD_BYTES_PER_S - others)
    assert model.wait_s(MIB, 0.5) == pytest.approx(expected)


def test_a_refusal_after_the_estimate_faded_puts_it_back_where_the_last_one_set_it():
    model = ShardBytes(None, RateState(SHARD_BURST_BYTES, 0.0, record_bytes=1000.0), 0.0)
    model.refused(1.0)  # first: an equal share
    taught = model.state(1.0).others
    assert model.state(1.0 + OTHERS_HOLD_S).others == taught  # held
    later = 1.0 + OTHERS_HOLD_S + 2 * OTHERS_HALF_LIFE_S
    assert model.state(later).others == pytest.approx(taught / 4)  # then two half-lives of fading
    carried = ShardBytes(None, model.state(later), later)  # the state travels with its peak
    carried.refused(later + 1)
    assert carried.state(later + 1).others >= taught


def test_a_retried_read_starts_no_fuller_than_its_first_attempt_can_have_left_the_shard():
    """Issue 46 item 3: the state a retried read starts from is the lower of the handed state
    less the whole range (refilled since) and an empty bucket; its first refusal is its own
    first attempt's debt, not another application's reads."""
    from kinesis_source.read_rate import retried_state

    handed = RateState(SHARD_BURST_BYTES, 1000.0, record_bytes=100_000.0)
    # the earlier attempt may have read 13 MB from a 10 MiB bucket two seconds ago: 2.4 MiB owed
    state = retried_state(handed, 13_000_000, 1001.0)
    assert state.level == pytest.approx(SHARD_BURST_BYTES - 13_000_000 + 2 * MIB, abs=1)
    assert state.at == 1001.0 and state.record_bytes == 100_000.0 and state.cap_level == 0.0
    # a small range, or one whose size is not known: empty now
    assert retried_state(handed, 1_000, 1001.0).level == 0.0
    assert retried_state(None, 0, 1001.0).level == 0.0
    # a range far larger than the bucket: the bucket never owes more than one response
    assert retried_state(handed, 60_000 * 1024, 1001.0).level == -SHARD_BURST_BYTES
    model = ShardBytes(None, state, 1001.0, own_debt=True)
    model.refused(1001.5)
    model.refused(1002.0)  # the second refusal is others' (an equal share, as for any first one)
    assert model.throttles == 2 and model.state(1002.0).others == pytest.approx(SHARD_BYTES_PER_S * 0.5)
    alone = ShardBytes(None, state, 1001.0, own_debt=True)
    alone.refused(1001.5)
    assert alone.state(1001.5).others == 0.0
    capped = ShardBytes(MIB, retried_state(handed, 0, 1001.0), 1001.0)
    assert capped.available(1001.0) <= 0.0  # the cap's bucket starts empty too
