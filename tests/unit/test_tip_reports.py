"""Executors' tip reports: the wire format, the driver's listener (real TCP on 127.0.0.1), and how
the tip table applies them."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from contextlib import contextmanager

import pytest

from kinesis_source.aws.kinesis import ARRIVAL_MARGIN_S
from kinesis_source.driver.planner import plan_ranges
from kinesis_source.driver.reports import TipListener
from kinesis_source.executor import report as sender
from kinesis_source.executor.report import Delivery
from kinesis_source.positions import Offset, Position, ShardId
from kinesis_source.read_rate import RateState
from kinesis_source.tip_reports import WATCH_ENDED, WATCH_LIVE, ReportAddress, TipReport, decode, encode
from tests.support.waiting import wait_for
from tests.unit.fake_kinesis import FakeShard, log_of
from tests.unit.test_tips import TimedFake, planner_on, trim_horizon

A = ShardId("s", "a")


def applied(address: ReportAddress, tips: list[TipReport]) -> bool:
    """Send ``tips``; True when the driver answered that it applied them."""
    return sender.send_reports(address, tips) is Delivery.APPLIED


def test_a_report_round_trips_and_bad_ones_are_refused_naming_the_field():
    rate = RateState(-1024.0, 1.7e9, 2048.0, 1.6e9, 1000.0, 512.0)
    full = TipReport(A, "123", 0, None, {"GetRecords": [1.5]}, "120", 3, 900, 350, rate, 2, 1.7e9, WATCH_LIVE,
                     1.75e9, 7)
    for tip in (TipReport(A, "123", 40, "it-1"), full):
        token, tips = decode(encode("t0k", [tip], now=1.8e9), now=1.8e9)
        assert (token, tips) == ("t0k", [tip])
    # An executor's clock 30 s behind the driver's: its times arrive on the driver's clock (a
    # byte state taken as 30 s older would refill 60 MiB the shard never had).
    (moved,) = decode(encode("t0k", [full], now=1.8e9 - 30.0), now=1.8e9)[1]
    assert moved.rate is not None and moved.rate.at == rate.at + 30.0 and moved.rate.learned_at == 1.6e9 + 30.0
    assert moved.calls == {"GetRecords": [31.5]}
    # the server's clock, and the subscription's name (its watch's reports are told apart by it)
    assert moved.seq_at == full.seq_at and moved.subscribed_at == full.subscribed_at
    for bad, word in (
        ({"shard": "s/a", "seq": "12x", "behindMs": 0}, "sequence number"),
        ({"shard": "s/a", "seq": "12", "behindMs": -1}, "behindMs"),
        ({"shard": "s/a", "seq": "12", "behindMs": True}, "behindMs"),
        ({"shard": "nostream", "seq": "12", "behindMs": 0}, "stream"),
        ({"shard": "s/a", "seq": "12", "behindMs": 0, "iterator": 5}, "iterator"),
        ({"shard": "s/a", "seq": "12", "behindMs": 0, "past": -1}, "past"),
        ({"shard": "s/a", "seq": "12", "behindMs": 0, "readBytes": "9"}, "readBytes"),
        ({"shard": "s/a", "seq": "12", "behindMs": 0, "extraBytes": 1.5}, "extraBytes"),
        ({"shard": "s/a", "seq": "12", "behindMs": 0, "end": "x1"}, "sequence number"),
        ({"shard": "s/a", "seq": "12", "behindMs": 0, "throttled": -2}, "throttled"),
        ({"shard": "s/a", "seq": "12", "behindMs": 0, "rate": {"level": 1.0, "at": "x"}}, "at"),
        ({"shard": "s/a", "seq": "12", "behindMs": 0, "rate": [1]}, "read-rate state"),
        ({"shard": "s/a", "seq": "12", "behindMs": 0, "subscribedAt": "now"}, "subscribedAt"),
        ({"shard": "s/a", "seq": "12", "behindMs": 0, "subscribedAt": -1}, "subscribedAt"),
        ({"shard": "s/a", "seq": "12", "behindMs": 0, "watch": True}, "watch"),
        ({"shard": "s/a", "seq": "12", "behindMs": 0, "seqAt": "then"}, "seqAt"),
        ({"shard": "s/a", "seq": "12", "behindMs": 0, "inRange": -3}, "inRange"),
    ):
        with pytest.raises(ValueError, match=word):
            TipReport.from_json(bad)
    assert "t0k" not in repr(ReportAddress("127.0.0.1", 1, "t0k"))


def _listening(on_tips):
    """A listener on 127.0.0.1 in a loop thread of its own; (listener, loop, address)."""
    import threading

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    listener = TipListener("127.0.0.1", on_tips)
    address = asyncio.run_coroutine_threadsafe(listener.start(), loop).result(10)
    return listener, loop, address


def test_reports_reach_the_listener_only_with_the_runs_token():
    got: list[TipReport] = []
    listener, loop, address = _listening(got.extend)
    try:
        tip = TipReport(A, "77", 0, None)
        assert applied(address, [tip])
        assert got == [tip]
        forged = ReportAddress(address.host, address.port, "not-the-token")
        assert sender.send_reports(forged, [TipReport(A, "99", 0, None)]) is Delivery.REFUSED
        assert got == [tip] and listener.refused == 1
        import socket

        with socket.create_connection((address.host, address.port), timeout=5) as sock:
            sock.sendall(b"{not json\n")
            assert sock.recv(16) == b""  # closed without "ok"
        wait_for(lambda: listener.refused == 2, timeout=5, what="the garbage refused")
    finally:
        loop.call_soon_threadsafe(listener.close)
        loop.call_soon_threadsafe(loop.stop)


def test_an_unreachable_driver_costs_one_attempt_per_pause(monkeypatch):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: connections are refused
    address = ReportAddress("127.0.0.1", port, "t")
    tries = []
    real = socket.create_connection
    monkeypatch.setattr(sender.socket, "create_connection", lambda *a, **k: tries.append(1) or real(*a, **k))
    monkeypatch.setattr(sender, "_unreachable_until", {})
    tip = TipReport(A, "1", 0, None)
    assert sender.send_reports(address, [tip]) is Delivery.REFUSED
    assert sender.send_reports(address, [tip]) is Delivery.REFUSED
    assert len(tries) == 1


def test_a_driver_that_answers_late_is_paused_only_after_late_answers_in_a_row(monkeypatch):
    import socket
    import threading

    monkeypatch.setattr(sender, "SEND_TIMEOUT_S", 0.3)
    monkeypatch.setattr(sender, "_unreachable_until", {})
    monkeypatch.setattr(sender, "_late_in_a_row", {})
    answers = ["late", "late", "ok", "late", "late", "late"]
    served = []
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def serve():
        for answer in answers:
            conn, _ = server.accept()
            with conn:
                conn.makefile("rb").readline()
                served.append(answer)
                if answer == "ok":
                    conn.sendall(b"ok\n")
                else:
                    conn.recv(16)  # a busy driver: returns when the sender gives up

    threading.Thread(target=serve, daemon=True).start()
    address = ReportAddress("127.0.0.1", server.getsockname()[1], "t")
    tip = TipReport(A, "1", 0, None)
    try:
        got = [sender.send_reports(address, [tip]) for _ in answers]
        assert got == [Delivery.LATE, Delivery.LATE, Delivery.APPLIED, Delivery.LATE, Delivery.LATE, Delivery.LATE]
        # The third late answer in a row paused the driver: the next message is not sent.
        assert sender.send_reports(address, [tip]) is Delivery.REFUSED
        assert served == answers
    finally:
        server.close()


def reporting_planner(fake, **options):
    """A planner that probes often, within budgets that never hold a read back, listening for
    reports on 127.0.0.1."""
    return planner_on(fake, **{"minProbeIntervalMs": "20", "maxIdleProbeIntervalMs": "40",
                               "getRecordsPerShardPerSecond": "5", "getShardIteratorPerShardPerSecond": "5",
                               "tipReportHost": "127.0.0.1", **options})


def handed_first_range(planner):
    """Plan shard A's first batch from TRIM_HORIZON and hand its one range out: the range, and
    the address its read reports to."""
    start = trim_horizon(A)
    (rng,) = plan_ranges(start, planner.latest_offset(start))
    _, address = planner.hand_over([rng])
    assert address is not None
    return rng, address


def test_the_driver_does_not_probe_a_shard_being_read_and_answers_from_its_report():
    recs = log_of(40)
    fake = TimedFake({"a": FakeShard(recs[:10])})
    planner = reporting_planner(fake)
    try:
        start = trim_horizon(A)
        end = planner.latest_offset(start)
        assert end.shards[A] == Position.after(recs[9][0])
        _, address = planner.hand_over(plan_ranges(start, end))
        assert address is not None and address.host == "127.0.0.1"
        reads = len(fake.reads)
        fake.shards["a"].records.extend(recs[10:30])
        time.sleep(0.5)  # twelve probe intervals: none may come while the shard is read
        assert len(fake.reads) == reads, "the driver probed a shard an executor was reading"
        # The executor saw up to record 29 past its end, with the iterator after it.
        iterator = "a|30|0"
        assert applied(address, [TipReport(A, recs[29][0], 0, iterator)])
        assert planner.latest_offset(end).shards[A] == Position.after(recs[29][0])
        assert planner.stats()["tipReports"] == 1
        # The next probe goes on from the reported iterator: no GetShardIterator.
        fake.shards["a"].records.extend(recs[30:32])
        calls = len(fake.calls)
        wait_for(lambda: planner.latest_offset(end).shards[A] == Position.after(recs[31][0]),
                 timeout=10, what="the record after the report")
        assert "GetShardIterator" not in fake.calls[calls:], fake.calls[calls:]
    finally:
        planner.close()


def test_a_report_never_moves_a_tip_back_nor_before_the_tracked_start():
    recs = log_of(20)
    fake = TimedFake({"a": FakeShard(recs)})
    planner = planner_on(fake, minProbeIntervalMs="3600000", maxIdleProbeIntervalMs="3600000",
                         tipReportHost="127.0.0.1")
    try:
        start = after_offset(recs[4][0])
        end = planner.latest_offset(start)
        assert end.shards[A] == Position.after(recs[19][0])
        _, address = planner.hand_over([])
        assert address is not None
        # from a replayed batch: an older record, and one before the tracked start
        assert applied(address, [TipReport(A, recs[10][0], 0, None)])
        assert applied(address, [TipReport(A, recs[2][0], 0, None)])
        assert planner.latest_offset(start) == end
    finally:
        planner.close()


def after_offset(seq):
    from kinesis_source.positions import Offset

    return Offset({A: Position.after(seq)})


def test_a_report_that_never_comes_costs_a_probe_at_the_next_answer_not_a_stall():
    """An executor that cannot reach the driver sends nothing; once Spark asks for the next end
    (the batch is over), the shard is probed at once instead of waiting for the report's
    deadline, so its new records reach the next batch."""
    recs = log_of(20)
    fake = TimedFake({"a": FakeShard(recs[:10])})
    planner = reporting_planner(fake)
    try:
        start = trim_horizon(A)
        end = planner.latest_offset(start)
        planner.hand_over(plan_ranges(start, end))  # no executor: no report will come
        fake.shards["a"].records.extend(recs[10:20])
        planner.latest_offset(end)  # the next batch's question: the last one is over
        wait_for(lambda: planner.latest_offset(end).shards[A] == Position.after(recs[19][0]),
                 timeout=5, what="the new records without a report (deadline: 30 s)")
    finally:
        planner.close()


def test_the_reported_call_times_replace_the_reads_booking_in_the_ledger():
    from kinesis_source.driver.budget import GET_RECORDS
    from kinesis_source.executor.polling import RangeReader

    recs = log_of(20)
    fake = TimedFake({"a": FakeShard(recs)})
    planner = planner_on(fake, minProbeIntervalMs="3600000", maxIdleProbeIntervalMs="3600000",
                         getRecordsPerShardPerSecond="2", tipReports="true", tipReportHost="127.0.0.1")
    try:
        start = trim_horizon(A)
        end = wait_for(lambda: (e := planner.latest_offset(start)) != start and e, timeout=10,
                       what="the first batch")
        (rng,) = plan_ranges(start, end)
        booked, address = planner.hand_over([rng])
        assert address is not None
        reader = RangeReader(fake, rng, 100, opener=booked[A][0])
        assert len(list(reader.pages())) == 1
        tip = reader.tip_report()
        assert tip is not None
        assert sum(len(times) for times in tip.calls.values()) == reader.calls  # every call reported
        time.sleep(0.5)  # the task started half a second after its booking: it calls now
        tip = TipReport(tip.shard, tip.seq, tip.behind_ms, tip.iterator, {"GetRecords": [time.time()]}, tip.end)
        assert applied(address, [tip])
        # a driver call leaving the reads' share of 2 a second: it fits a second after the
        # actual call, not after the booking (half a second earlier)
        assert planner.budget.free_at(A, GET_RECORDS, keep=1) >= time.monotonic() + 0.9
    finally:
        planner.close()


def test_a_read_spark_runs_again_adds_its_calls_and_bytes_and_teaches_no_neighbour():
    """Issue 46: Spark may run a planned read again after its first run reported (a batch's
    partitions re-executed by a second action, a speculative copy). That read was never booked:
    its calls join the shard's call window and its bytes are spent from the driver's model, but
    the neighbour it learnt from its first run's unseen bytes is not taken (fails on 6e29bff:
    its calls went uncounted and its state replaced the driver's)."""
    from kinesis_source.driver.budget import GET_RECORDS
    from kinesis_source.read_rate import MIB

    recs = log_of(20)
    fake = TimedFake({"a": FakeShard(recs)})
    planner = reporting_planner(fake, getRecordsPerShardPerSecond="2", minProbeIntervalMs="3600000",
                                maxIdleProbeIntervalMs="3600000")
    try:
        rng, address = handed_first_range(planner)
        now = time.time()
        first = TipReport(A, recs[-1][0], 0, None, {"GetRecords": [now]}, rng.end_seq, read_bytes=3 * MIB,
                          rate=RateState(5 * MIB, now, record_bytes=123.0))
        assert applied(address, [first])
        assert planner.byte_budget.model(A).record_bytes == 123.0, "the booked read's state is adopted"
        wait_for(lambda: planner.budget.room(A, GET_RECORDS) == 2, timeout=5, what="the window to empty")
        level = planner.byte_budget.model(A).state(time.time()).level
        now = time.time()
        again = TipReport(A, recs[-1][0], 0, None, {"GetRecords": [now, now]}, rng.end_seq, read_bytes=3 * MIB,
                          rate=RateState(4 * MIB, now, others=MIB, learned_at=now, taught=MIB), throttled=1)
        assert applied(address, [again])
        state = planner.byte_budget.model(A).state(time.time())
        assert state.others == 0.0, "no neighbour learnt from the read's own first run"
        assert state.level < level - 2.5 * MIB, "the second run's bytes are spent"
        assert planner.budget.room(A, GET_RECORDS) == 0, "its two calls fill the shard's window"
    finally:
        planner.close()


def test_a_read_is_told_when_its_second_call_fits_after_the_drivers_probes():
    """The driver stops probing a shard while an executor reads it (the report resumes them),
    so a read's second call need only wait for the driver's probes before the read to leave the
    call window: the booking says when that is. Without a probe in the last window, it fits at
    once (the read's own spacing applies); with one just before, a window after it."""
    from kinesis_source.driver.budget import GET_RECORDS

    recs = log_of(10)
    fake = TimedFake({"a": FakeShard(recs[:5]), "b": FakeShard(recs[5:])})
    b = ShardId("s", "b")
    planner = reporting_planner(fake, getRecordsPerShardPerSecond="2", minProbeIntervalMs="3600000",
                                maxIdleProbeIntervalMs="3600000")
    try:
        start = trim_horizon(A, b)
        end = planner.latest_offset(start)
        assert end.shards[A] == Position.after(recs[4][0]) and end.shards[b] == Position.after(recs[9][0])
        wait_for(lambda: all(planner.budget.room(s, GET_RECORDS) == 2 for s in (A, b)), timeout=5,
                 what="the first probes to leave the call window")
        probed = time.time()
        planner.budget.spend(b, GET_RECORDS)  # a probe of b just now
        booked, address = planner.hand_over(plan_ranges(start, end))
        assert address is not None
        first, second = booked[A][1], booked[A][6]
        assert second is not None and abs(second - first) < 0.05
        first, second = booked[b][1], booked[b][6]
        assert second is not None and probed + 1.0 - 0.01 <= second <= time.time() + 1.0 + ARRIVAL_MARGIN_S
        assert first < second - 0.5
    finally:
        planner.close()
    # without reports the driver does not hold its probes: no time is handed on
    planner = planner_on(fake, tipReports="false")
    try:
        start = trim_horizon(A)
        end = planner.latest_offset(start)
        assert planner.hand_over(plan_ranges(start, end))[0][A][6] is None
    finally:
        planner.close()


def test_ranges_get_their_size_when_reports_and_probes_saw_every_record():
    """A report says how many records the read saw past its range's end: the next range, from
    that end to the reported tip, holds exactly that many; a probe that read on from there to
    the tip without skipping adds what it read. A probe that jumped near the tip knows no size.
    Executors get the size only for shards whose ranges move many bytes a second (below that,
    reading past the end is cheaper than the probe that would then find the tip)."""
    from kinesis_source.driver.tips import EXACT_READ_BYTES_PER_S

    recs = log_of(2000)
    fake = TimedFake({"a": FakeShard(recs[:10])})
    planner = reporting_planner(fake)
    try:
        start = trim_horizon(A)
        end = planner.latest_offset(start)
        assert end.shards[A] == Position.after(recs[9][0])
        _, address = planner.hand_over(plan_ranges(start, end))
        fake.shards["a"].records.extend(recs[10:16])
        # the executor read to record 9 and saw 6 more past it
        assert applied(address, [TipReport(A, recs[15][0], 0, "a|16|0", {}, recs[9][0], 6, 1, 1)])
        tips = planner.parts.tips
        nxt = planner.latest_offset(end)
        assert nxt.shards[A] == Position.after(recs[15][0])
        assert tips.count(A, end.shards[A], recs[15][0]) == 6
        assert planner.hand_over(plan_ranges(end, nxt))[0][A][2] is None  # a quiet shard: no size
        # the probe goes on from the reported iterator and reads the 3 new records to the tip
        fake.shards["a"].records.extend(recs[16:19])
        wait_for(lambda: planner.latest_offset(end).shards[A] == Position.after(recs[18][0]),
                 timeout=10, what="the probe's tip")
        assert tips.count(A, end.shards[A], recs[18][0]) == 9
        # a busy shard (its reads' ranges hold many bytes a second): executors get the size
        busy = int(EXACT_READ_BYTES_PER_S * 10)  # bytes per report, a report well within 10 s
        for _ in range(2):
            assert applied(address, [TipReport(A, recs[18][0], 0, None, {}, recs[18][0], 0, busy, 0)])
        assert planner.hand_over(plan_ranges(end, planner.latest_offset(end)))[0][A][2] == 9
        # a backlog longer than the probe's warm read (it then looks near the tip): no size
        fake.shards["a"].payloads.update({seq: b"x" * 1000 for seq, _ in recs[19:]})
        fake.shards["a"].records.extend(recs[19:])
        wait_for(lambda: planner.latest_offset(end).shards[A] == Position.after(recs[-1][0]),
                 timeout=10, what="the tip past the backlog")
        assert tips.count(A, end.shards[A], recs[-1][0]) is None
    finally:
        planner.close()


def test_ranges_between_reported_and_probed_records_get_an_estimated_size():
    """Issue 17, no double reads: a busy shard's range from a record an executor reported to the
    tip a probe found near it holds records nobody counted. The report and the probe say when
    their records arrived, counted records with known arrivals give the shard's record rate,
    and the range goes out with a size estimated from them, instead of none (with none, the
    read takes everything up to the shard's tip, to read it again in the next batch)."""
    from kinesis_source.driver.tips import EXACT_READ_BYTES_PER_S
    from kinesis_source.read_rate import ESTIMATE_MARGIN

    recs = log_of(200, spacing=0.1)  # 10 records a second
    fake = TimedFake({"a": FakeShard(recs[:10])})
    planner = reporting_planner(fake)
    try:
        start = trim_horizon(A)
        end = planner.latest_offset(start)
        booked, address = planner.hand_over(plan_ranges(start, end))
        fake.shards["a"].records.extend(recs[10:16])
        tips = planner.parts.tips
        assert tips.entries[A].arrivals[recs[9][0]] == pytest.approx(recs[9][1])  # the probe's tip
        # a range of unknown size goes out with its end record's arrival, to time its last call
        assert booked[A][2] is None and booked[A][4] == pytest.approx(recs[9][1])
        busy = int(EXACT_READ_BYTES_PER_S * 10)  # bytes per report, a report well within 10 s
        for _ in range(2):
            # the read of the range to record 9 saw 6 more, the last one arriving at its time
            assert applied(address, [TipReport(A, recs[15][0], 0, None, {}, recs[9][0], 6, busy, 0,
                                               seq_at=recs[15][1])])
        assert tips.entries[A].record_rate == pytest.approx(10.0)
        fake.shards["a"].records.extend(recs[16:150])  # the probe looks near the tip: no count
        wait_for(lambda: planner.latest_offset(end).shards[A] == Position.after(recs[149][0]),
                 timeout=10, what="the tip past the new records")
        after = Position.after(recs[15][0])
        assert tips.count(A, after, recs[149][0]) is None
        booked = planner.hand_over(plan_ranges(Offset({A: after}), planner.latest_offset(end)))[0]
        # 134 records in 13.4 s at 10 a second, and the margin
        assert booked[A][2] == math.ceil(134 * (1 + ESTIMATE_MARGIN))
        assert booked[A][4] is None  # sized: the arrival is not needed
        # the read's report says how many records the range held: it is counted from then on
        assert applied(address, [TipReport(A, recs[149][0], 0, None, {}, recs[149][0], 0, busy, 0,
                                           seq_at=recs[149][1], in_range=134)])
        assert tips.count(A, after, recs[149][0]) == 134
    finally:
        planner.close()


def test_an_estimated_size_is_the_arrivals_distance_at_the_shards_record_rate():
    from kinesis_source.driver.tip_view import ShardTip
    from kinesis_source.read_rate import ESTIMATE_MARGIN

    view = ShardTip(Position.trim_horizon(), byte_rate=1_000_000.0, record_rate=100.0,
                    arrivals={"100": 50.0, "200": 50.5})
    # half a second of a shard moving 100 records a second: 50 records, and the margin
    assert view.read_size(Position.after("100"), "200") == math.ceil(50 * (1 + ESTIMATE_MARGIN))
    assert view.read_size(Position.after("100"), "300") is None  # an end of unknown arrival
    view.record_rate = 0.0
    assert view.read_size(Position.after("100"), "200") is None  # a rate not known yet
    view.record_rate, view.byte_rate = 100.0, 1_000.0
    # a quiet shard is read past its end (the read's report is its next tip)
    assert view.read_size(Position.after("100"), "200") is None


@contextmanager
def fan_out_read(recs):
    """A fan-out planner whose first batch, the shard's first ten records, was planned and handed
    to a read: (fake, planner, the batch's end, the report address)."""
    fake = TimedFake({"a": FakeShard(recs[:10])})
    planner = reporting_planner(fake, consumerMode="efo")
    try:
        start = trim_horizon(A)
        end = planner.latest_offset(start)
        _, address = planner.hand_over(plan_ranges(start, end))
        yield fake, planner, end, address
    finally:
        planner.close()


def test_fan_out_holds_a_shard_until_kinesis_allows_its_next_subscription():
    recs = log_of(40)
    with fan_out_read(recs) as (fake, planner, end, address):
        fake.shards["a"].records.extend(recs[10:20])
        subscribed = time.time() - 4.5  # the read subscribed 4.5 s ago
        assert applied(address, [TipReport(A, recs[9][0], 0, None, subscribed_at=subscribed)])
        assert planner.latest_offset(end).shards[A] == end.shards[A], "planned within Kinesis' 5 s"
        moved = wait_for(lambda: (o := planner.latest_offset(end)).shards[A] != end.shards[A] and o,
                         timeout=10, what="the shard's next range")
        assert time.time() >= subscribed + 5.0
        # probes went on while the shard was held: its end is the newest record
        assert moved.shards[A] == Position.after(recs[19][0])


def test_a_watched_shard_is_not_probed_and_its_tips_come_from_the_watch():
    """Fan-out: while the read's subscription reports as the shard's tip watch, the driver makes
    no GetRecords for it; the watch's end gives the shard back to the probes at once, and an
    older watch's end (taken over by the read whose watch now reports) does not."""
    recs = log_of(40)
    with fan_out_read(recs) as (fake, planner, end, address):
        subscribed = time.time() - 6.0  # past Kinesis' 5 s: the shard is not held
        read = TipReport(A, recs[9][0], 0, None, subscribed_at=subscribed)
        watched = dataclasses.replace(read, watch=WATCH_LIVE)
        assert applied(address, [read, watched])
        reads = len(fake.reads)
        fake.shards["a"].records.extend(recs[10:20])
        time.sleep(0.5)  # an observation window: 12 probe intervals
        assert len(fake.reads) == reads, "the driver probed a watched shard"
        assert planner.latest_offset(end) == end  # nothing reported yet: nothing planned
        assert applied(address, [dataclasses.replace(watched, seq=recs[14][0])])
        assert planner.latest_offset(end).shards[A] == Position.after(recs[14][0])
        # An older watch ends: the newer one still holds the shard.
        assert applied(address, [dataclasses.replace(watched, subscribed_at=subscribed - 10,
                                                                 watch=WATCH_ENDED)])
        time.sleep(0.5)
        assert len(fake.reads) == reads, "an older watch's end let the probes in"
        # The watch's own end: the driver probes again, and finds the rest.
        assert applied(address, [dataclasses.replace(watched, seq=recs[14][0], watch=WATCH_ENDED)])
        wait_for(lambda: planner.latest_offset(end).shards[A] == Position.after(recs[19][0]),
                 timeout=10, what="the probe after the watch's end")


def test_a_watch_whose_reports_stop_loses_the_shard_to_the_probes_after_its_lease(monkeypatch):
    from kinesis_source.driver import tip_view

    monkeypatch.setattr(tip_view, "WATCH_LEASE_S", 0.5)
    recs = log_of(20)
    with fan_out_read(recs) as (fake, planner, end, address):
        tip = TipReport(A, recs[9][0], 0, None, subscribed_at=time.time() - 6.0)
        assert applied(address, [tip, dataclasses.replace(tip, watch=WATCH_LIVE)])
        fake.shards["a"].records.extend(recs[10:20])
        wait_for(lambda: planner.latest_offset(end).shards[A] == Position.after(recs[19][0]),
                 timeout=10, what="the probe after the lease")


def test_an_available_now_range_goes_out_with_its_caps_arrival():
    """Issue 20: a catch-up's range (of unknown size) ends at the record the run's target fixed.
    The tip table may never have seen that record as a tip (from a start the target's probe says
    nothing of, a timestamp, its first probe found newer ones): the target's probe saw when it
    arrived, and the read gets that, to time its last call."""
    from datetime import datetime, timezone

    recs = log_of(40, spacing=0.1)
    fake = TimedFake({"a": FakeShard(recs[:20])})
    planner = reporting_planner(fake)
    try:
        planner.prepare_available_now()
        fake.shards["a"].records.extend(recs[20:])  # arrived after the run began: not read
        start = Offset({A: Position.at_timestamp(datetime.fromtimestamp(recs[0][1] - 1, tz=timezone.utc))})
        end = planner.latest_offset(start)
        assert end.shards[A] == Position.after(recs[19][0])
        assert planner.parts.tips.arrival(A, recs[19][0]) is None  # the table's tips are newer
        booked, _ = planner.hand_over(plan_ranges(start, end))
        assert booked[A][2] is None and booked[A][4] == pytest.approx(recs[19][1])
    finally:
        planner.close()


def test_an_available_now_runs_first_answer_starts_from_its_targets_probe():
    """The target's probe of each shard (from TRIM_HORIZON, 3 calls a shard for a backlog at
    one a second) found its newest record: the tip table's first answer from a start before it
    starts from that, with no probe of its own from the start (measured on the catch-up: the
    executors began 3 s earlier); its next probe goes on from the target's tip."""
    recs = log_of(40, spacing=0.1)
    fake = TimedFake({"a": FakeShard(recs[:20])})
    planner = reporting_planner(fake)
    try:
        planner.prepare_available_now()
        iterators = fake.calls.count("GetShardIterator")
        fake.shards["a"].records.extend(recs[20:])
        start = trim_horizon(A)
        end = planner.latest_offset(start)
        assert end.shards[A] == Position.after(recs[19][0])
        assert planner.parts.tips.arrival(A, recs[19][0]) == pytest.approx(recs[19][1])
        # the table's probes go on from the target's tip, with the iterator it left there
        wait_for(lambda: planner.parts.tips.entries[A].tip == recs[39][0], timeout=10, what="a probe past the target")
        assert fake.calls.count("GetShardIterator") == iterators
    finally:
        planner.close()


def test_the_default_report_host_is_an_address_other_hosts_reach_as_spark_finds_the_drivers(monkeypatch):
    """Issue 52's day-one defect: the listener bound to the address the host name resolves to,
    loopback on Debian's default /etc/hosts, so executors on other hosts never reached it. The
    default now follows Spark's own choice of the driver's address."""
    from kinesis_source.driver import reports

    monkeypatch.setenv("SPARK_LOCAL_IP", "10.9.8.7")
    assert reports.default_host() == "10.9.8.7"
    monkeypatch.delenv("SPARK_LOCAL_IP")
    monkeypatch.setattr(reports.socket, "gethostname", lambda: "localhost")  # resolves to loopback
    monkeypatch.setattr(reports, "interface_addresses",
                        lambda: ["127.0.0.1", "169.254.3.4", "192.0.2.9", "198.51.100.3"])
    assert reports.default_host() == "192.0.2.9"
    monkeypatch.setattr(reports, "interface_addresses", lambda: ["127.0.0.1"])
    assert reports.is_loopback(reports.default_host())


def test_this_machines_interfaces_are_read_without_sending_anything():
    from kinesis_source.driver.reports import interface_addresses, is_loopback

    found = interface_addresses()
    assert "127.0.0.1" in found and all(a.count(".") == 3 for a in found)
    assert is_loopback("127.0.1.1") and not is_loopback("192.0.2.1")


def test_reads_whose_reports_never_come_are_counted_and_the_driver_says_what_to_set(caplog):
    """Issue 52: with the report port unreachable the query still reads everything (the driver
    probes), but silently; the progress now counts the reports missing and the driver warns,
    naming tipReportHost."""
    recs = log_of(20_000)
    fake = TimedFake({"a": FakeShard(recs)})
    planner = reporting_planner(fake)
    try:
        start = trim_horizon(A)
        with caplog.at_level("WARNING", logger="kinesis_source.driver.planner"):
            for n in range(4):
                # more new records each batch than a probe reads: executors must read them
                fake.shards["a"].records = recs[: 5000 * (n + 1)]
                end = wait_for(lambda s=start: (e := planner.latest_offset(s)) != s and e, timeout=10,
                               what=f"batch {n}")
                planner.hand_over(plan_ranges(start, end))  # no executor reports back
                start = end
        assert planner.stats()["tipReportsMissing"] == 3
        assert any("tipReportHost" in r.getMessage() and "none ever arrived" in r.getMessage()
                   for r in caplog.records)
    finally:
        planner.close()


def test_a_long_catch_ups_reports_are_bounded_by_construction_and_all_applied():
    """Issue 46: a task's report was refused whole when its call-time lists passed 10,000
    entries or its line 4 MiB (a long catch-up with many shards a task). A read now reports its
    newest call times and how many it made, and a task's reports go in bounded messages."""
    from kinesis_source.tip_reports import MAX_MESSAGE_BYTES, REPORTED_CALLS, call_record, messages

    now = time.time()
    times = {"GetRecords": [now - 30_000 + i for i in range(30_000)], "GetShardIterator": [now - 5]}
    calls, made = call_record(times)
    assert calls["GetRecords"] == times["GetRecords"][-REPORTED_CALLS:] and made["GetRecords"] == 30_000
    past = tuple({"SequenceNumber": str(10**20 + i), "Data": b"x" * 40_000, "PartitionKey": "k",
                  "ApproximateArrivalTimestamp": now} for i in range(1))
    tips = [TipReport(ShardId("s", f"shard-{i:04d}"), str(10**20), 0, "i" * 300, calls, "1", 1,
                      carried=past, made=made) for i in range(400)]
    lines = [encode("t0k", m) for m in messages(tips)]
    assert len(lines) > 1 and all(len(line) <= MAX_MESSAGE_BYTES for line in lines)
    got: list[TipReport] = []
    listener, loop, address = _listening(got.extend)
    try:
        for message in messages(tips):
            assert applied(address, message)
        # (the call times arrive moved by the transit, a few milliseconds)
        assert [(t.shard, t.made, len(t.calls["GetRecords"]), len(t.carried or ())) for t in got] == [
            (t.shard, made, REPORTED_CALLS, 1) for t in tips]
    finally:
        loop.call_soon_threadsafe(listener.close)
        loop.call_soon_threadsafe(loop.stop)


def test_the_driver_counts_every_call_a_report_made_and_windows_its_newest():
    from kinesis_source.driver.budget import GET_RECORDS, CallBudget

    budget = CallBudget({GET_RECORDS: 2.0})
    budget.settle("a", GET_RECORDS, [], [100.0, 100.4], made=5_000)
    assert budget.spent[GET_RECORDS] == 5_000
    assert budget.room("a", GET_RECORDS, 100.5) == 0 and budget.room("a", GET_RECORDS, 101.5) == 2


def test_a_reported_iterator_is_handed_on_only_while_young_enough_counted_from_its_read():
    """Audit of issue 46: an iterator in a report was timed from the report's arrival, though a
    task reports once all its shards are read (minutes after a shard's last call): the next
    range's executor then got an expired iterator and made an unbooked GetShardIterator."""
    from kinesis_source.aws.kinesis import HANDED_ITERATOR_TTL_S

    recs = log_of(30)
    fake = TimedFake({"a": FakeShard(recs)})
    planner = reporting_planner(fake, minProbeIntervalMs="3600000", maxIdleProbeIntervalMs="3600000")
    try:
        _, address = handed_first_range(planner)
        old = time.time() - HANDED_ITERATOR_TTL_S - 10
        fake.shards["a"].records = recs  # (unchanged) the report names the last record
        assert applied(address, [TipReport(A, recs[-1][0], 0, "a|30|0", {"GetRecords": [old]})])
        assert planner.parts.prober.opener(A, Position.after(recs[-1][0])) is None
        fresh = time.time()
        assert applied(address, [TipReport(A, recs[-1][0], 0, "a|30|0", {"GetRecords": [fresh]})])
        assert planner.parts.prober.opener(A, Position.after(recs[-1][0])) == ("a|30|0", None)
    finally:
        planner.close()


def test_no_report_is_missing_when_none_was_asked_for():
    recs = log_of(20_000)
    fake = TimedFake({"a": FakeShard(recs)})
    planner = planner_on(fake, tipReports="false")
    try:
        start = trim_horizon(A)
        for n in range(3):
            fake.shards["a"].records = recs[: 5000 * (n + 1)]
            end = wait_for(lambda s=start: (e := planner.latest_offset(s)) != s and e, timeout=10, what=f"batch {n}")
            planner.hand_over(plan_ranges(start, end))
            start = end
        assert planner.stats()["tipReportsMissing"] == 0
    finally:
        planner.close()


def test_a_late_report_does_not_take_the_booking_of_the_shards_next_range():
    """Audit of issue 46: bookings were kept by shard only, so batch N's late report took batch
    N+1's booking (freeing its first call's place in the window) and N+1's own report then
    counted as a re-run. A report settles the booking of its own range only."""
    from kinesis_source.driver.budget import GET_RECORDS

    recs = log_of(20_000)
    fake = TimedFake({"a": FakeShard(recs[:5000])})
    planner = reporting_planner(fake, getRecordsPerShardPerSecond="1", minProbeIntervalMs="3600000",
                                maxIdleProbeIntervalMs="3600000")
    try:
        start = trim_horizon(A)
        end = planner.latest_offset(start)
        (first,) = plan_ranges(start, end)
        planner.hand_over([first])
        fake.shards["a"].records = recs[:10000]
        later = wait_for(lambda: (e := planner.latest_offset(end)) != end and e, timeout=10, what="batch 2")
        (second,) = plan_ranges(end, later)
        _, address = planner.hand_over([second])
        assert address is not None
        late = TipReport(A, first.end_seq, 0, None, {"GetRecords": [time.time() - 3]}, first.end_seq)
        assert applied(address, [late])
        assert planner.shards.state(A).booking[0] == second.end_seq, "the next range's booking stays"
        assert planner.budget.room(A, GET_RECORDS) == 0  # its booked first call still holds the window
    finally:
        planner.close()
