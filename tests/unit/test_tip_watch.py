"""Tip watches (``executor/watch.py``): a fan-out read's subscription goes on after its range and
reports the shard's new records to the driver over real TCP on 127.0.0.1."""

from __future__ import annotations

import queue
import socket
import threading
import time

import pytest

from kinesis_source.executor import report, watch
from kinesis_source.executor.fanout import SubscribeRangeReader
from kinesis_source.positions import Position, ShardId, ShardRange
from kinesis_source.tip_reports import WATCH_ENDED, WATCH_LIVE, ReportAddress, TipReport, decode
from tests.support.waiting import wait_for
from tests.unit.fake_kinesis import log_of

A = ShardId("s", "a")
DATA = b"0123456789"
ARN = "arn:aws:kinesis:us-east-1:123456789012:stream/s/consumer/c:1"


class Driver:
    """A report listener that keeps every tip it is sent and answers ``ok`` (or refuses)."""

    def __init__(self, accept: bool = True) -> None:
        self.accept = accept
        self.late = 0  # messages to take but not answer (a busy driver): the sender times out
        self.tips: list[TipReport] = []
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.address = ReportAddress("127.0.0.1", self._sock.getsockname()[1], "token")
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                line = conn.makefile("rb").readline()
                _, tips = decode(line)
                self.tips.extend(tips)
                if self.late:
                    self.late -= 1
                    conn.recv(16)  # returns when the sender gives up and closes
                    continue
                conn.sendall(b"ok\n" if self.accept else b"no\n")

    def close(self) -> None:
        self._sock.close()


class Events:
    """A subscription's events, fed by the test; ``close`` ends the iteration as a dropped
    connection would."""

    def __init__(self, events=()) -> None:
        self._queue: queue.Queue = queue.Queue()
        for event in events:
            self.put(event)
        self.closed = threading.Event()

    def put(self, event) -> None:
        self._queue.put(event)

    def put_records(self, recs, behind=0) -> None:
        self.put({"SubscribeToShardEvent": {
            "Records": [{"SequenceNumber": s, "Data": DATA, "PartitionKey": "k"} for s, _ in recs],
            "MillisBehindLatest": behind, "ContinuationSequenceNumber": recs[-1][0] if recs else "1",
        }})

    def __iter__(self):
        while True:
            event = self._queue.get()
            if event is None:
                return
            if isinstance(event, BaseException):
                raise event
            yield event

    def close(self) -> None:
        self.closed.set()
        self._queue.put(None)


@pytest.fixture
def driver():
    d = Driver()
    yield d
    d.close()


@pytest.fixture(autouse=True)
def no_watches_left():
    yield
    for shard in watch.watched():
        watch.stop_watch(ARN, shard.shard)
    wait_for(lambda: not watch.watched(), timeout=5, what="the test's watches to end")


def reports(driver, kind):
    return [t for t in driver.tips if t.watch == kind]


def test_a_watch_reports_new_records_heartbeats_and_its_end(driver, monkeypatch):
    monkeypatch.setattr(watch, "WATCH_HEARTBEAT_S", 0.3)
    monkeypatch.setattr(watch, "WATCH_SILENT_S", 1.0)
    recs = log_of(6)
    events = Events()
    assert watch.start_watch(ARN, A, driver.address, recs[1][0], 0, 1.7e9, iter(events), events.close)
    assert watch.watched() == [A]
    events.put_records(recs[2:5])
    wait_for(lambda: any(t.seq == recs[4][0] for t in reports(driver, WATCH_LIVE)), timeout=5,
             what="the watch's report of the new records")
    first = next(t for t in driver.tips if t.seq == recs[4][0])
    assert first.subscribed_at == 1.7e9 and first.iterator is None
    assert first.extra_bytes == first.read_bytes == 3 * len(DATA)
    # Events without records: the watch says it lives on, every heartbeat interval.
    for _ in range(3):
        count = len(driver.tips)
        events.put_records([])
        wait_for(lambda n=count: len(driver.tips) > n, timeout=5, what="a heartbeat")
        assert driver.tips[-1].seq == recs[4][0] and driver.tips[-1].watch == WATCH_LIVE
    # Once its subscription is silent for WATCH_SILENT_S, no heartbeat keeps the driver away.
    time.sleep(watch.WATCH_SILENT_S + 2 * watch.WATCH_HEARTBEAT_S)  # the subscription falls silent
    count = len(driver.tips)
    time.sleep(3 * watch.WATCH_HEARTBEAT_S)  # an observation window: three heartbeat intervals
    assert watch.watched() == [A]
    events.close()  # the subscription ends (taken over, dropped, Kinesis' 5 minutes)
    wait_for(lambda: reports(driver, WATCH_ENDED), timeout=5, what="the watch's last report")
    assert driver.tips[count:] == reports(driver, WATCH_ENDED), "a heartbeat without events"
    assert not watch.watched()


def test_a_driver_that_does_not_take_the_reports_ends_the_watch():
    stopped = Driver(accept=False)
    try:
        recs = log_of(3)
        events = Events()
        assert watch.start_watch(ARN, A, stopped.address, recs[0][0], 0, None, iter(events), events.close)
        events.put_records(recs[1:])
        assert events.closed.wait(5), "the subscription was kept for a driver that refused its report"
        wait_for(lambda: not watch.watched(), timeout=5, what="the watch to end")
    finally:
        stopped.close()


def test_a_driver_that_answers_late_keeps_the_watch(driver, monkeypatch):
    monkeypatch.setattr(report, "SEND_TIMEOUT_S", 0.3)
    monkeypatch.setattr(report, "_unreachable_until", {})
    monkeypatch.setattr(report, "_late_in_a_row", {})
    recs = log_of(5)
    events = Events()
    driver.late = 1
    assert watch.start_watch(ARN, A, driver.address, recs[0][0], 0, None, iter(events), events.close)
    events.put_records(recs[1:3])
    wait_for(lambda: driver.tips and driver.late == 0, timeout=5, what="the report answered late")
    events.put_records(recs[3:])
    wait_for(lambda: any(t.seq == recs[4][0] for t in driver.tips), timeout=5,
             what="the next report, after the late answer")
    assert watch.watched() == [A] and not events.closed.is_set()


def test_the_shards_end_ends_the_watch(driver):
    recs = log_of(3)
    events = Events()
    assert watch.start_watch(ARN, A, driver.address, recs[0][0], 0, None, iter(events), events.close)
    events.put({"SubscribeToShardEvent": {"Records": [], "MillisBehindLatest": 0, "ChildShards": []}})
    assert events.closed.wait(5)
    wait_for(lambda: reports(driver, WATCH_ENDED), timeout=5, what="the end reported")


class Subscriptions:
    """SubscribeToShard whose first events hold ``first`` and whose later ones the test feeds."""

    def __init__(self, first) -> None:
        self.events = Events()
        self.events.put_records(first)
        self.calls = 0

    def subscribe_to_shard(self, ConsumerARN, ShardId, StartingPosition):
        self.calls += 1
        return {"EventStream": self.events}


def test_a_complete_range_hands_its_subscription_to_a_watch_and_the_next_read_ends_it(driver):
    recs = log_of(10)
    subs = Subscriptions(recs[:6])
    rng = ShardRange("s", "a", Position.trim_horizon(), recs[3][0])
    reader = SubscribeRangeReader(subs, ARN, rng, watch_to=driver.address, in_use_gap_s=0.0)
    assert [r["SequenceNumber"] for page in reader.pages() for r in page] == [s for s, _ in recs[:4]]
    assert reader.tip_report().seq == recs[5][0]  # what the read saw past its end
    assert watch.watched() == [A] and not subs.events.closed.is_set()
    said = reader.watch_report()  # the task's message tells the driver the watch goes on
    assert (said.seq, said.watch) == (recs[5][0], WATCH_LIVE)
    subs.events.put_records(recs[6:8])
    wait_for(lambda: any(t.seq == recs[7][0] for t in reports(driver, WATCH_LIVE)), timeout=5,
             what="the records after the read, from its subscription")
    # The shard's next read in this process takes the subscription back first.
    SubscribeRangeReader(Subscriptions(recs[8:]), ARN, ShardRange("s", "a", Position.after(recs[7][0]), recs[9][0]),
                         in_use_gap_s=0.0)._subscribe()
    assert subs.events.closed.wait(5)
    wait_for(lambda: not watch.watched(), timeout=5, what="the watch to end")


def test_without_a_report_address_or_past_a_shards_end_the_subscription_is_closed():
    recs = log_of(6)
    subs = Subscriptions(recs[:6])
    reader = SubscribeRangeReader(subs, ARN, ShardRange("s", "a", Position.trim_horizon(), recs[3][0]),
                                  in_use_gap_s=0.0)
    list(reader.pages())
    assert subs.events.closed.is_set() and not watch.watched() and reader.watch_report() is None
