"""The fan-out range reader against an in-memory subscription server: the same cursor rules
as the polling reader (issue 14 item 4)."""

from __future__ import annotations

import pytest

from kinesis_source.errors import RangeIncompleteError
from kinesis_source.executor.fanout import SubscribeRangeReader
from kinesis_source.positions import Position, ShardRange
from tests.unit.fake_kinesis import FakeKinesis, FakeShard, log_of


def _reader(*args, **kwargs):
    """A fan-out reader that does not wait out Kinesis' 5 s between its subscriptions (the
    fake has no such rule)."""
    return SubscribeRangeReader(*args, in_use_gap_s=0.0, **kwargs)


class _Stream:
    def __init__(self, events):
        self._events = events

    def __iter__(self):
        return iter(self._events)

    def close(self):
        pass


class FakeSubscriptions:
    """SubscribeToShard over a :class:`FakeKinesis` log: each subscription serves
    ``per_event`` records per event until the tip, then ends (as the 5-minute end would)."""

    def __init__(self, fake: FakeKinesis, per_event: int) -> None:
        self.fake = fake
        self.per_event = per_event
        self.starts: list[dict] = []

    def subscribe_to_shard(self, ConsumerARN, ShardId, StartingPosition):
        self.starts.append(StartingPosition)
        kind = StartingPosition["Type"]
        kw = {}
        if "SequenceNumber" in StartingPosition:
            kw["StartingSequenceNumber"] = StartingPosition["SequenceNumber"]
        it = self.fake.get_shard_iterator(
            StreamName=self.fake.stream, ShardId=ShardId, ShardIteratorType=kind, **kw
        )["ShardIterator"]
        events = []
        for _ in range(3):  # a short subscription: three events
            page = self.fake.get_records(ShardIterator=it, Limit=self.per_event)
            events.append(
                {
                    "SubscribeToShardEvent": {
                        "Records": page["Records"],
                        "MillisBehindLatest": page["MillisBehindLatest"],
                        "ContinuationSequenceNumber": "0",
                    }
                }
            )
            it = page.get("NextShardIterator")
            if it is None:
                break
        return {"EventStream": _Stream(events)}


def read(subs, rng):
    reader = _reader(subs, "arn:consumer", rng, retry_wait_s=0, max_wait_s=0)
    return [r["SequenceNumber"] for page in reader.pages() for r in page]


def test_after_range_whose_first_event_holds_only_the_start_record_reads_on():
    """A same-millisecond burst (MillisBehindLatest 0) served one record per event: the first
    event holds only the dropped start record; that is not the tip."""
    recs = log_of(12, spacing=0.0)
    subs = FakeSubscriptions(FakeKinesis({"a": FakeShard(recs)}), per_event=1)
    assert read(subs, ShardRange("s", "a", Position.after(recs[3][0]), recs[8][0])) == [
        s for s, _ in recs[4:9]
    ]


def test_resubscription_continues_after_the_last_record_read_and_checks_it():
    recs = log_of(20)
    subs = FakeSubscriptions(FakeKinesis({"a": FakeShard(recs)}), per_event=2)
    got = read(subs, ShardRange("s", "a", Position.after(recs[1][0]), recs[15][0]))
    assert got == [s for s, _ in recs[2:16]]
    # every subscription opened at the last record read, which it checked and dropped
    assert all(s["Type"] == "AT_SEQUENCE_NUMBER" for s in subs.starts)
    assert subs.starts[1]["SequenceNumber"] == recs[6][0]  # events: [1, 2], [3, 4], [5, 6]


def test_range_past_the_tip_fails_naming_the_tip():
    recs = log_of(5)
    subs = FakeSubscriptions(FakeKinesis({"a": FakeShard(recs)}), per_event=10)
    with pytest.raises(RangeIncompleteError, match="tip, its newest record being"):
        read(subs, ShardRange("s", "a", Position.trim_horizon(), "9" * 60))


class Described(FakeSubscriptions):
    """Also answers DescribeStreamConsumer / DescribeStreamSummary, like the real service."""

    def describe_stream_consumer(self, ConsumerARN):
        return {"ConsumerDescription": {"ConsumerARN": ConsumerARN, "ConsumerStatus": "ACTIVE"}}

    def describe_stream_summary(self, StreamName):
        return self.fake.describe_stream_summary(StreamName=StreamName)


def test_subscription_to_a_shard_gone_since_planning_is_data_loss_as_failOnDataLoss_says():
    """Issue 14 item 8 with fan-out: the stream and the consumer exist, the shard does not."""
    from kinesis_source.errors import DataLossError

    recs = log_of(5)
    subs = Described(FakeKinesis({"a": FakeShard(recs)}), per_event=10)
    rng = ShardRange("s", "zz", Position.trim_horizon(), recs[-1][0])
    with pytest.raises(DataLossError, match="stream 's' no longer has shard 'zz'"):
        read(subs, rng)
    lenient = _reader(subs, "arn:consumer", rng, fail_on_data_loss=False)
    assert list(lenient.pages()) == []


def test_a_refused_start_falls_back_for_good_even_if_the_next_subscription_is_empty():
    """Issue 22 item 4: the start position is refused (older than the retention) and, with
    failOnDataLoss=false, the read goes on from TRIM_HORIZON; a subscription there that ends
    before its first record is renewed at TRIM_HORIZON, not at the refused position."""
    from botocore.exceptions import ClientError

    recs = log_of(6)

    class Refusing(FakeSubscriptions):
        def __init__(self, *args) -> None:
            super().__init__(*args)
            self.empty_next = 1

        def subscribe_to_shard(self, ConsumerARN, ShardId, StartingPosition):
            if StartingPosition["Type"] != "TRIM_HORIZON":
                self.starts.append(StartingPosition)
                error = {"Error": {"Code": "InvalidArgumentException", "Message": "expired"}}
                raise ClientError(error, "SubscribeToShard")
            if self.empty_next:
                self.empty_next -= 1
                self.starts.append(StartingPosition)
                return {"EventStream": _Stream([])}  # ended before any event
            return super().subscribe_to_shard(ConsumerARN, ShardId, StartingPosition)

    subs = Refusing(FakeKinesis({"a": FakeShard(recs)}), 10)
    rng = ShardRange("s", "a", Position.after("1"), recs[-1][0])  # "1": long trimmed
    reader = _reader(
        subs, "arn:consumer", rng, fail_on_data_loss=False, retry_wait_s=0, max_wait_s=0
    )
    got = [r["SequenceNumber"] for page in reader.pages() for r in page]
    assert got == [s for s, _ in recs]
    assert [s["Type"] for s in subs.starts] == ["AT_SEQUENCE_NUMBER", "TRIM_HORIZON", "TRIM_HORIZON"]


def test_a_fan_out_read_reports_what_it_saw_past_its_end_without_the_records():
    """Issue 46: the driver carries no ranges in fan-out, so records a report carried past the
    range's end were dropped on arrival: they are no longer sent (the polling reader's are)."""
    from kinesis_source.executor.polling import RangeReader

    recs = log_of(12)
    fake = FakeKinesis({"a": FakeShard(recs)})
    rng = ShardRange("s", "a", Position.after(recs[1][0]), recs[4][0])
    reader = _reader(FakeSubscriptions(fake, per_event=6), "arn:consumer", rng, retry_wait_s=0, max_wait_s=0)
    assert [r["SequenceNumber"] for page in reader.pages() for r in page] == [s for s, _ in recs[2:5]]
    tip = reader.tip_report()
    assert tip is not None and tip.past > 0 and tip.carried is None
    polled = RangeReader(fake, rng, 6)
    list(polled.pages())
    tip = polled.tip_report()
    assert tip is not None and tip.past > 0 and tip.carried is not None and len(tip.carried) == tip.past
