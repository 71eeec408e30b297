"""Enhanced fan-out building blocks against the test EFO server in front of each backend:
ranges read by subscription hold exactly what PutRecords acknowledged and what plain boto3
GetRecords calls read, through resubscriptions and errors; the consumer lifecycle.

The answers come from outside the readers: the producer's acknowledged sequence numbers and
tests/support/boto3_reads.py, never our polling ``RangeReader``, which shares ``RangeCursor``,
``check_opening`` and ``opening_position`` with the fan-out reader (a bug there would pass a
comparison of the two). Mutant caught: ``check_opening`` returning ``records`` instead of
``records[1:]`` for an ``AFTER`` start (the start record read again)."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timezone

import pytest
from botocore.exceptions import ClientError

from kinesis_source.aws.clients import AwsSettings, error_code
from kinesis_source.aws.kinesis import IN_USE
from kinesis_source.driver.consumers import deregister_consumer, ensure_consumer, stream_arn
from kinesis_source.errors import (
    ConsumerError,
    DataLossError,
    KinesisSourceError,
    RangeIncompleteError,
)
from kinesis_source.executor.arrow import to_record_batch, user_records
from kinesis_source.executor.fanout import SubscribeRangeReader
from kinesis_source.positions import Position, ShardRange
from tests.support.boto3_reads import read_range_boto3
from tests.support.efo_server import EfoServer
from tests.support.producer import Producer
from tests.support.proxy import FaultProxy
from tests.support.waiting import wait_for

RECORDS = 240


def Reader(*args, **kwargs):  # noqa: N802 - the reader class, for a server without the 5 s rule
    """A fan-out reader that does not wait out Kinesis' 5 s between its own subscriptions of a
    shard (the fixture's server does not have the rule; the tests of the rule say so)."""
    return SubscribeRangeReader(*args, in_use_gap_s=kwargs.pop("in_use_gap_s", 0.0), **kwargs)


def _client(url: str, read_timeout_s: float = 30.0) -> object:
    # Few, quick botocore retries: the consumer-limit test gets a LimitExceededException,
    # which botocore retries as throttling.
    return AwsSettings(
        region="us-east-1",
        endpoint_url=url,
        access_key_id="local",
        secret_key="local",
        max_retries=2,
        retry_base_delay_ms=10,
    ).silent_for_at_most(read_timeout_s).boto3_client("kinesis")


@pytest.fixture
def efo_server(kinesis_backend):
    """A fresh EFO server in front of the backend under test (small pages: many events)."""
    with EfoServer(kinesis_backend, activation_delay_s=0.3, page_limit=25) as server:
        server.in_use_window_s = server.min_call_gap_s = 0.0  # the rules' own tests turn them on
        yield server


@pytest.fixture
def client(efo_server):
    """Our Kinesis client (epoch-seconds timestamps) on the EFO server."""
    return _client(efo_server.url)


@pytest.fixture
def backing_client(kinesis_backend):
    """Our Kinesis client on the backend itself, for the plain GetRecords oracle reads."""
    return _client(kinesis_backend)


@pytest.fixture
def filled(make_stream, kinesis):
    """A 2-shard stream with RECORDS records; returns (stream, {shard: [Put, ...]})."""
    stream = make_stream(2)
    puts = Producer(kinesis, stream).put(RECORDS, burst=40)
    by_shard: dict[str, list] = {}
    for put in puts:
        by_shard.setdefault(put.shard_id, []).append(put)
    assert len(by_shard) == 2 and all(len(v) > 40 for v in by_shard.values())
    return stream, by_shard


def _ranges(stream: str, shard: str, seqs: list[str], arrival_of_10: float) -> list[ShardRange]:
    n = len(seqs)
    return [
        ShardRange(stream, shard, Position.trim_horizon(), seqs[n // 2]),
        ShardRange(stream, shard, Position.after(seqs[3]), seqs[n - 1]),
        ShardRange(stream, shard, Position.at(seqs[5]), seqs[30]),
        ShardRange(stream, shard, Position.after(seqs[7]), seqs[8]),  # one record
        ShardRange(stream, shard, Position.after(seqs[12], 2), seqs[20]),  # inside an aggregate
        ShardRange(
            stream,
            shard,
            Position.at_timestamp(datetime.fromtimestamp(arrival_of_10, tz=timezone.utc)),
            seqs[n - 2],
        ),
    ]


def _read(reader) -> list[dict]:
    return [rec for page in reader.pages() for rec in page]


def _expected(backing_client, rng: ShardRange) -> list[dict]:
    """The range's records by plain boto3 calls (see tests/support/boto3_reads.py). A range
    starting inside an aggregate (``AFTER:s:sub``) yields the record ``s`` itself (the user
    records up to ``sub`` are dropped later, by ``user_records``), so it is read from ``AT:s``."""
    start = rng.start.to_str()
    if rng.start.kind == "AFTER" and rng.start.sub_seq is not None:
        start = f"AT:{rng.start.seq}"
    return read_range_boto3(backing_client, rng.stream, rng.shard_id, start, rng.end_seq)


def _acknowledged(puts, rng: ShardRange) -> list[tuple[str, bytes, str]]:
    """(sequence number, data, partition key) of what PutRecords acknowledged for the range's
    shard, from its start up to its end, compared as integers (an ``AT`` start and one inside
    an aggregate include the start's record, an ``AFTER`` start does not)."""
    start, end = rng.start, int(rng.end_seq)
    if start.kind == "TRIM_HORIZON":
        first = lambda seq: True  # noqa: E731 (the stream holds only these puts)
    elif start.kind == "AT" or (start.kind == "AFTER" and start.sub_seq is not None):
        first = lambda seq: seq >= int(start.seq)  # noqa: E731
    elif start.kind == "AFTER":
        first = lambda seq: seq > int(start.seq)  # noqa: E731
    else:
        raise AssertionError(f"no acknowledged answer for {start}")
    ordered = sorted(puts, key=lambda p: int(p.seq))
    return [
        (p.seq, p.data, p.partition_key)
        for p in ordered
        if first(int(p.seq)) and int(p.seq) <= end
    ]


def _assert_reads(got: list[dict], rng: ShardRange, backing_client, puts) -> None:
    """``got`` is the range: what plain GetRecords reads, record for record, and (for every
    start but AT_TIMESTAMP, whose cut only the server knows) what PutRecords acknowledged."""
    assert got == _expected(backing_client, rng), rng
    if rng.start.kind != "AT_TIMESTAMP":
        seen = [(r["SequenceNumber"], r["Data"], r["PartitionKey"]) for r in got]
        assert seen == _acknowledged(puts, rng), rng


def _all_ranges(backing_client, stream, by_shard):
    out = []
    for shard, puts in sorted(by_shard.items()):
        seqs = [p.seq for p in puts]
        records = read_range_boto3(backing_client, stream, shard, "TRIM_HORIZON", seqs[-1])
        assert [r["SequenceNumber"] for r in records] == seqs  # what PutRecords acknowledged
        out.extend(_ranges(stream, shard, seqs, records[10]["ApproximateArrivalTimestamp"]))
    return out


def _consumer(client, stream: str) -> str:
    name = f"c-{uuid.uuid4().hex[:8]}"
    return ensure_consumer(client, stream, name, timeout_s=10, poll_s=0.05)


def test_subscribe_reads_what_get_records_reads(efo_server, client, backing_client, filled):
    stream, by_shard = filled
    arn = _consumer(client, stream)
    for rng in _all_ranges(backing_client, stream, by_shard):
        expected = _expected(backing_client, rng)
        reader = Reader(client, arn, rng)
        got = _read(reader)
        _assert_reads(got, rng, backing_client, by_shard[rng.shard_id])
        assert got and got[-1]["SequenceNumber"] == rng.end_seq
        assert reader.subscriptions == 1 and reader.failures == 0
        # The rest of the read path cannot tell the two apart.
        assert user_records(got, rng, "fail") == user_records(expected, rng, "fail")
        assert to_record_batch(stream, rng.shard_id, got).equals(
            to_record_batch(stream, rng.shard_id, expected)
        )
    wait_for(lambda: efo_server.live_subscriptions() == 0, timeout=10, what="subscriptions closed")


@pytest.mark.parametrize("chunk", [7, 1000])
def test_messages_cut_across_http_chunks_read_the_same(chunk, efo_server, client, backing_client, filled):
    """Kinesis' HTTP chunks need not follow message boundaries: a message may span chunks, and a
    chunk may end one message and start the next."""
    stream, by_shard = filled
    arn = _consumer(client, stream)
    efo_server.chunk_bytes = chunk
    for rng in _all_ranges(backing_client, stream, by_shard)[:2]:
        reader = Reader(client, arn, rng)
        _assert_reads(_read(reader), rng, backing_client, by_shard[rng.shard_id])
        assert reader.subscriptions == 1 and reader.failures == 0


def test_kpl_aggregates_over_fan_out_expand_to_the_user_records_put(efo_server, client, make_stream, kinesis):
    """Aggregates made by aws-kinesis-agg, read by subscription from inside one: the user
    records after the start, in order, each with its own partition key."""
    from tests.support.aggregates import aggregate

    stream = make_stream(1)
    shard = kinesis.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    users = [[(f"k{a}-{u}", f"agg{a}-user{u}".encode()) for u in range(5)] for a in range(4)]
    seqs = []
    for group in users:
        key, data = aggregate(group)
        seqs.append(kinesis.put_record(StreamName=stream, Data=data, PartitionKey=key)["SequenceNumber"])
    rng = ShardRange(stream, shard, Position.after(seqs[1], 2), seqs[3])  # after user record 2 of #1
    got = user_records(_read(Reader(client, _consumer(client, stream), rng)), rng, "fail")
    want = users[1][3:] + users[2] + users[3]
    assert [(r["PartitionKey"], r["Data"]) for r in got] == want
    assert [(r["SequenceNumber"], r["SubSequenceNumber"]) for r in got] == (
        [(seqs[1], i) for i in (3, 4)] + [(seqs[n], i) for n in (2, 3) for i in range(5)])


def test_two_consumers_read_one_shard_at_once(efo_server, client, backing_client, filled):
    """Two applications' consumers on one shard: each subscription gets every record."""
    import threading

    stream, by_shard = filled
    rng = _all_ranges(backing_client, stream, by_shard)[1]
    readers = [Reader(client, _consumer(client, stream), rng) for _ in range(2)]
    got: list[list[dict]] = [[], []]
    threads = [threading.Thread(target=lambda i=i: got[i].extend(_read(readers[i]))) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for records in got:
        _assert_reads(records, rng, backing_client, by_shard[rng.shard_id])
    assert [r.failures for r in readers] == [0, 0]


def test_resubscribes_when_subscriptions_end(efo_server, client, backing_client, filled):
    stream, by_shard = filled
    arn = _consumer(client, stream)
    efo_server.end_after_events = 2  # as Kinesis does after 5 minutes, every 2 events here
    efo_server.page_limit = 5
    for rng in _all_ranges(backing_client, stream, by_shard)[:3]:
        before = efo_server.subscriptions
        reader = Reader(client, arn, rng)
        expected = _expected(backing_client, rng)
        _assert_reads(_read(reader), rng, backing_client, by_shard[rng.shard_id])
        assert reader.subscriptions > 1 and reader.failures == 0
        calls = efo_server.subscribe_calls[before:]
        assert len(calls) == reader.subscriptions
        # The first opens at the range's start, each next one at the last record the previous
        # one delivered, which it checks is still there and drops (10 records: 2 events of 5).
        assert calls[0].starting_position == _opening_request(rng.start)
        assert [c.starting_position for c in calls[1:]] == [
            {"Type": "AT_SEQUENCE_NUMBER", "SequenceNumber": seq}
            for seq in _delivered_last(rng, expected)[: len(calls) - 1]
        ]


def _opening_request(start: Position) -> dict:
    """The StartingPosition a range's first subscription asks for, written out: one record
    before the position, so that its record can be checked (``AFTER:s`` opens at ``AT:s``)."""
    if start.kind == "TRIM_HORIZON":
        return {"Type": "TRIM_HORIZON"}
    assert start.kind in ("AT", "AFTER"), start
    return {"Type": "AT_SEQUENCE_NUMBER", "SequenceNumber": start.seq}


def _delivered_last(rng: ShardRange, expected: list[dict]) -> list[str]:
    """The last record of each subscription of 10 records: the first from the opening position
    (which re-reads the record of an ``AFTER`` start), each next one from the last record of
    the previous (re-read to check it), so 9 new records each."""
    seqs = [r["SequenceNumber"] for r in expected]
    if rng.start.kind == "AFTER" and rng.start.sub_seq is None:
        seqs = [rng.start.seq] + seqs
    return seqs[9::9]


def test_second_subscription_is_refused_then_takes_over(efo_server, client, filled):
    stream, by_shard = filled
    arn = _consumer(client, stream)
    shard = sorted(by_shard)[0]
    efo_server.in_use_window_s = 5.0  # as Kinesis; long enough that the second call is inside it

    def subscribe():
        return client.subscribe_to_shard(
            ConsumerARN=arn, ShardId=shard, StartingPosition={"Type": "TRIM_HORIZON"}
        )

    first = subscribe()["EventStream"]
    with pytest.raises(ClientError, match="ResourceInUseException"):
        subscribe()

    def take_over():
        try:
            return subscribe()
        except ClientError as exc:
            assert error_code(exc) == IN_USE
            return None

    second = wait_for(take_over, timeout=10, interval=0.05, what="a subscription taking over")
    with pytest.raises(ClientError, match="ResourceInUseException"):
        for _ in first:
            pass
    second["EventStream"].close()


def test_a_subscription_taken_over_mid_range_is_resumed_and_named(
    efo_server, client, backing_client, filled, caplog
):
    stream, by_shard = filled
    arn = _consumer(client, stream)
    rng = _all_ranges(backing_client, stream, by_shard)[1]
    efo_server.inject_error("ResourceInUseException", after_events=2, times=1)  # what Kinesis sends
    reader = Reader(client, arn, rng, retry_wait_s=0.01)
    with caplog.at_level("WARNING", logger="kinesis_source.executor.fanout"):
        _assert_reads(_read(reader), rng, backing_client, by_shard[rng.shard_id])
    assert reader.failures == 1
    assert "taken over by another SubscribeToShard" in caplog.text and "'consumerName'" in caplog.text


@pytest.mark.backends("moto")
def test_an_event_larger_than_botocore_reads_fails_the_read_naming_what_to_do(
    efo_server, client, make_stream, kinesis
):
    """19 records of 1 MiB in one event: 25 MiB base64-encoded, over botocore's 24 MiB per
    event-stream message (as two records of 10 MiB would be on Kinesis)."""
    stream = make_stream(1)
    shard = kinesis.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    big = b"x" * (1024 * 1024 - 16)
    seqs = [kinesis.put_record(StreamName=stream, Data=big, PartitionKey=f"k{i}")["SequenceNumber"]
            for i in range(19)]
    efo_server.page_limit = 100
    arn = _consumer(client, stream)
    reader = Reader(client, arn, ShardRange(stream, shard, Position.trim_horizon(), seqs[-1]))
    with pytest.raises(KinesisSourceError) as err:
        _read(reader)
    message = str(err.value)
    assert f"{stream}/{shard}" in message and "TRIM_HORIZON" in message
    assert "24 MiB" in message and "consumerMode=polling" in message
    assert reader.subscriptions == 1  # not resubscribed into the same event


def test_error_events_mid_range_are_survived(efo_server, client, backing_client, filled):
    stream, by_shard = filled
    arn = _consumer(client, stream)
    rng = _all_ranges(backing_client, stream, by_shard)[1]  # AFTER:s3 .. last record
    efo_server.inject_error("InternalFailureException", after_events=2, times=2)
    reader = Reader(client, arn, rng, retry_wait_s=0.01)
    _assert_reads(_read(reader), rng, backing_client, by_shard[rng.shard_id])
    assert reader.failures == 2 and reader.subscriptions == 3


def test_dropped_connections_are_survived(efo_server, client, backing_client, filled):
    stream, by_shard = filled
    arn = _consumer(client, stream)
    rng = _all_ranges(backing_client, stream, by_shard)[0]  # TRIM_HORIZON .. the middle
    efo_server.drop_connection(after_events=1, times=2)
    reader = Reader(client, arn, rng, retry_wait_s=0.01)
    _assert_reads(_read(reader), rng, backing_client, by_shard[rng.shard_id])
    assert reader.failures == 2 and reader.subscriptions == 3


def test_a_silent_subscription_is_renewed_after_the_subscribe_timeout(efo_server, backing_client, filled):
    """subscribeTimeoutMs is the EFO client's read timeout: a subscription that sends nothing
    (not even the empty events Kinesis sends while no record arrives) is dropped after it and
    renewed after the last record read."""
    stream, by_shard = filled
    silent_for = 1.0
    client = _client(efo_server.url, read_timeout_s=silent_for)
    arn = _consumer(client, stream)
    rng = _all_ranges(backing_client, stream, by_shard)[0]
    efo_server.stall(after_events=1, seconds=30.0, times=1)  # longer than the test waits
    reader = Reader(client, arn, rng, retry_wait_s=0.01)
    started = time.monotonic()
    _assert_reads(_read(reader), rng, backing_client, by_shard[rng.shard_id])
    assert reader.failures == 1 and reader.subscriptions == 2
    took = time.monotonic() - started
    assert silent_for <= took < 25.0  # renewed after the timeout, not after the stall ended


def test_a_consumer_deregistered_mid_read_is_named(efo_server, client, backing_client, filled):
    """Issue 22 item 5: the in-stream ResourceNotFoundException Kinesis sends when the consumer
    goes away reaches the user as a clear error, not a raw botocore EventStreamError."""
    from kinesis_source.errors import KinesisSourceError

    stream, by_shard = filled
    arn = _consumer(client, stream)
    rng = _all_ranges(backing_client, stream, by_shard)[0]
    efo_server.page_limit = 2  # many events, so the subscription is still going
    pages = Reader(client, arn, rng, retry_wait_s=0.01).pages()
    next(pages)
    client.deregister_stream_consumer(ConsumerARN=arn)
    with pytest.raises(KinesisSourceError, match="the consumer was not found") as err:
        list(pages)
    assert arn in str(err.value) and "deregistered while the query ran" in str(err.value)


def test_a_subscription_refused_because_the_consumer_is_being_deleted_is_named_at_once(
    efo_server, client, backing_client, filled
):
    """Found by chaos scenario 10: a consumer being deleted refuses SubscribeToShard with
    ResourceInUseException, which the reader took for Kinesis' 5-second rule and retried each
    second until its attempts ran out, then failed with botocore's bare error."""
    from kinesis_source.errors import KinesisSourceError

    stream, by_shard = filled
    arn = _consumer(client, stream)
    rng = _all_ranges(backing_client, stream, by_shard)[0]
    efo_server.deletion_delay_s = 60.0  # DELETING for longer than the test
    client.deregister_stream_consumer(ConsumerARN=arn)
    before = efo_server.calls.get("SubscribeToShard", 0)
    reader = Reader(client, arn, rng, retry_wait_s=0.01)
    with pytest.raises(KinesisSourceError, match="the consumer was not found") as err:
        list(reader.pages())
    assert arn in str(err.value) and "Restarting the query registers it again" in str(err.value)
    assert efo_server.calls.get("SubscribeToShard", 0) - before == 1  # not retried


def test_kms_errors_inside_the_stream_name_the_permission(efo_server, client, backing_client, filled):
    from kinesis_source.errors import KinesisSourceError

    stream, by_shard = filled
    arn = _consumer(client, stream)
    rng = _all_ranges(backing_client, stream, by_shard)[0]
    efo_server.inject_error("KMSAccessDeniedException", after_events=1, times=1)
    with pytest.raises(KinesisSourceError, match="kms:Decrypt") as err:
        _read(Reader(client, arn, rng, retry_wait_s=0.01))
    assert rng.shard_id in str(err.value) and stream in str(err.value)


def _subscribed_by_another_worker(efo_server, client, backing_client, filled):
    """Kinesis' subscription rules on, and a range whose shard another worker has just
    subscribed to: (consumer ARN, range, the range's records)."""
    stream, by_shard = filled
    arn = _consumer(client, stream)
    rng = _all_ranges(backing_client, stream, by_shard)[1]
    efo_server.in_use_window_s, efo_server.min_call_gap_s = 5.0, 1.0  # as Kinesis
    client.subscribe_to_shard(ConsumerARN=arn, ShardId=rng.shard_id,
                              StartingPosition={"Type": "LATEST"})["EventStream"].close()
    return arn, rng, by_shard[rng.shard_id]


def test_a_subscription_refused_by_another_process_is_retried_each_second(
    efo_server, client, backing_client, filled
):
    """Another worker subscribed to the shard less than 5 s ago (this process cannot know):
    the refused call is tried again a second later, within Kinesis' 1 call/s per shard."""
    arn, rng, expected = _subscribed_by_another_worker(efo_server, client, backing_client, filled)
    time.sleep(1.0)  # the other worker's call was a second ago (Kinesis allows one per second)
    started = time.monotonic()
    reader = Reader(client, arn, rng, retry_wait_s=0.05)
    _assert_reads(_read(reader), rng, backing_client, expected)
    assert efo_server.refused == {"ResourceInUseException": 4, "LimitExceededException": 0}
    assert reader.failures == 4 and reader.subscriptions == 1
    assert 3.9 <= time.monotonic() - started


def test_a_subscription_refused_for_the_call_rate_is_not_re_sent_within_the_second(
    efo_server, client, backing_client, filled
):
    """Another worker's call came a moment before this reader's first: Kinesis refuses it
    (one SubscribeToShard a second per consumer and shard, refused calls counted). A re-send by
    botocore's throttling retry would be refused again, and again: the reader's calls keep a
    second apart, so that one refusal is the only one of its kind."""
    arn, rng, expected = _subscribed_by_another_worker(efo_server, client, backing_client, filled)
    reader = Reader(client, arn, rng, retry_wait_s=0.05)
    _assert_reads(_read(reader), rng, backing_client, expected)
    assert efo_server.refused["LimitExceededException"] == 1, efo_server.timeline()
    assert reader.subscriptions == 1
    mine = [t for t, shard, _, _ in efo_server.attempts if shard == rng.shard_id][1:]
    gaps = [b - a for a, b in zip(mine, mine[1:], strict=False)]
    assert len(mine) >= 5 and min(gaps) >= 1.0, efo_server.timeline()


def test_refusals_under_the_subscription_rules_do_not_spend_a_reads_attempts(
    efo_server, client, backing_client, filled
):
    """A read allowed 2 failures meets another worker's subscription: it is refused for 5 s
    (about 5 calls, one a second), which is another subscriber being there, not a failure, and
    the read goes on once the rules allow it."""
    arn, rng, expected = _subscribed_by_another_worker(efo_server, client, backing_client, filled)
    reader = Reader(client, arn, rng, max_attempts=2, retry_wait_s=0.05)
    _assert_reads(_read(reader), rng, backing_client, expected)
    assert sum(efo_server.refused.values()) >= 4 and reader.subscriptions == 1, efo_server.timeline()


def test_a_process_waits_out_its_own_last_subscription_instead_of_being_refused(
    efo_server, client, backing_client, filled
):
    stream, by_shard = filled
    arn = _consumer(client, stream)
    rng = _all_ranges(backing_client, stream, by_shard)[1]
    efo_server.in_use_window_s, efo_server.min_call_gap_s = 5.0, 1.0  # as Kinesis
    efo_server.inject_error("InternalFailureException", after_events=1, times=1)
    reader = Reader(client, arn, rng, retry_wait_s=0.05, in_use_gap_s=5.0)
    _assert_reads(_read(reader), rng, backing_client, by_shard[rng.shard_id])
    assert reader.failures == 1 and reader.subscriptions == 2
    assert efo_server.refused == {"ResourceInUseException": 0, "LimitExceededException": 0}
    # the next range of the shard, read in this process at once, waits too
    again = Reader(client, arn, rng, in_use_gap_s=5.0)
    _read(again)
    assert again.failures == 0 and efo_server.refused["ResourceInUseException"] == 0


def test_bounded_attempts(efo_server, client, backing_client, filled):
    stream, by_shard = filled
    arn = _consumer(client, stream)
    rng = _all_ranges(backing_client, stream, by_shard)[1]
    efo_server.inject_error("InternalFailureException", after_events=0, times=100)
    reader = Reader(client, arn, rng, max_attempts=3, retry_wait_s=0.01)
    with pytest.raises(Exception, match="InternalFailureException"):
        _read(reader)
    assert reader.subscriptions == 3


def test_range_past_the_tip_is_incomplete(efo_server, client, filled):
    stream, by_shard = filled
    arn = _consumer(client, stream)
    shard, puts = sorted(by_shard.items())[0]
    beyond = str(int(puts[-1].seq) + 1)
    rng = ShardRange(stream, shard, Position.after(puts[-5].seq), beyond)
    reader = Reader(client, arn, rng)
    got = []
    with pytest.raises(RangeIncompleteError, match="tip") as info:
        for page in reader.pages():
            got.extend(page)
    assert [r["SequenceNumber"] for r in got] == [p.seq for p in puts[-4:]]
    assert shard in str(info.value) and beyond in str(info.value)


def test_trimmed_start_is_data_loss(kinesis_backend, filled):
    stream, by_shard = filled
    shard, puts = sorted(by_shard.items())[0]
    rng = ShardRange(stream, shard, Position.after(puts[2].seq), puts[9].seq)
    # Records before puts[5] are gone, as after retention: the proxy's iterators land there.
    with FaultProxy(kinesis_backend) as proxy, EfoServer(proxy.url) as server:
        proxy.trim(stream, shard, puts[5].seq)
        client = _client(server.url)
        arn = _consumer(client, stream)
        with pytest.raises(DataLossError, match=f"{shard}.*oldest record left is {puts[5].seq}"):
            _read(Reader(client, arn, rng))
        got = _read(Reader(client, arn, rng, fail_on_data_loss=False))
        # plain GetRecords through the proxy land on the oldest record left, puts[5]
        assert got == read_range_boto3(_client(proxy.url), stream, shard, "TRIM_HORIZON", rng.end_seq)
    assert [(r["SequenceNumber"], r["Data"]) for r in got] == [(p.seq, p.data) for p in puts[5:10]]


@pytest.mark.backends("kinesis-local")  # moto never ends a split shard's GetRecords
def test_closed_shard(efo_server, client, backing_client, make_stream, kinesis):
    stream = make_stream(1)
    puts = Producer(kinesis, stream).put(30)
    [parent] = kinesis.list_shards(StreamName=stream)["Shards"]
    keys = parent["HashKeyRange"]
    middle = (int(keys["StartingHashKey"]) + int(keys["EndingHashKey"])) // 2
    kinesis.split_shard(
        StreamName=stream, ShardToSplit=parent["ShardId"], NewStartingHashKey=str(middle)
    )
    wait_for(
        lambda: len(kinesis.list_shards(StreamName=stream)["Shards"]) == 3,
        timeout=30,
        what="the split's children",
    )
    arn = _consumer(client, stream)
    shard = parent["ShardId"]
    # A range up to the parent's last record reads like GetRecords does.
    rng = ShardRange(stream, shard, Position.after(puts[4].seq), puts[-1].seq)
    _assert_reads(_read(Reader(client, arn, rng)), rng, backing_client, puts)
    # The subscription's last event names the children, and the stream ends.
    events = client.subscribe_to_shard(
        ConsumerARN=arn,
        ShardId=shard,
        StartingPosition={"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": puts[-2].seq},
    )["EventStream"]
    last = [e["SubscribeToShardEvent"] for e in events][-1]
    assert len(last["ChildShards"]) == 2
    assert all(c["ParentShards"] == [shard] for c in last["ChildShards"])
    # A range planned past the end cannot complete: said, not cut short silently.
    beyond = str(int(puts[-1].seq) + 1)
    rng = ShardRange(stream, shard, Position.after(puts[-3].seq), beyond)
    with pytest.raises(RangeIncompleteError, match="the shard ended"):
        _read(Reader(client, arn, rng))
    # The end is the null continuation, whatever else the last event holds (KCL and Flink read
    # it so): without children and still "behind", the shard is not resubscribed forever.
    efo_server.child_shards_on_end, efo_server.end_behind_ms = False, 1000
    reader = Reader(client, arn, rng)
    with pytest.raises(RangeIncompleteError, match="the shard ended"):
        _read(reader)
    assert reader.subscriptions == 1


# -- consumer lifecycle ------------------------------------------------------------------


def test_ensure_consumer_registers_once_and_waits_for_active(efo_server, client, make_stream):
    stream = make_stream(1)
    efo_server.activation_delay_s = 0.5
    started = time.monotonic()
    arn = ensure_consumer(client, stream, "app", timeout_s=10, poll_s=0.05)
    assert time.monotonic() - started >= 0.5
    desc = client.describe_stream_consumer(ConsumerARN=arn)["ConsumerDescription"]
    assert desc["ConsumerStatus"] == "ACTIVE" and desc["ConsumerName"] == "app"
    assert ensure_consumer(client, stream, "app", timeout_s=10, poll_s=0.05) == arn
    assert efo_server.calls["RegisterStreamConsumer"] == 1
    arn_of_stream = stream_arn(client, stream)
    consumers = client.list_stream_consumers(StreamARN=arn_of_stream)["Consumers"]
    assert [c["ConsumerName"] for c in consumers] == ["app"]


def test_deregister_consumer(efo_server, client, make_stream):
    stream = make_stream(1)
    arn = ensure_consumer(client, stream, "app", timeout_s=10, poll_s=0.05)
    assert deregister_consumer(client, stream, "app", timeout_s=10, poll_s=0.05) is True
    assert deregister_consumer(client, stream, "app") is False
    # The name is free again: a new consumer (a new ARN) is registered.
    efo_server.activation_delay_s = 0.0
    again = ensure_consumer(client, stream, "app", timeout_s=10, poll_s=0.05)
    assert efo_server.calls["RegisterStreamConsumer"] == 2
    assert again.startswith(arn.rpartition(":")[0])


def test_ensure_consumer_waits_out_a_deletion(efo_server, client, make_stream):
    stream = make_stream(1)
    ensure_consumer(client, stream, "app", timeout_s=10, poll_s=0.05)
    efo_server.deletion_delay_s = 0.4
    deregister_consumer(client, stream, "app")  # DELETING for 0.4 s
    arn = ensure_consumer(client, stream, "app", timeout_s=10, poll_s=0.05)
    desc = client.describe_stream_consumer(ConsumerARN=arn)["ConsumerDescription"]
    assert desc["ConsumerStatus"] == "ACTIVE"


def test_registration_waits_while_the_stream_is_updating(efo_server, client, make_stream):
    stream = make_stream(1)
    efo_server.update_streams(0.6)  # a reshard in progress
    started = time.monotonic()
    arn = ensure_consumer(client, stream, "app", timeout_s=10, poll_s=0.05)
    assert time.monotonic() - started >= 0.5
    assert efo_server.calls["RegisterStreamConsumer"] >= 2
    desc = client.describe_stream_consumer(ConsumerARN=arn)["ConsumerDescription"]
    assert desc["ConsumerStatus"] == "ACTIVE"


def test_a_stream_updating_for_too_long_is_named(efo_server, client, make_stream):
    stream = make_stream(1)
    efo_server.update_streams(60)
    with pytest.raises(ConsumerError, match=f"'app'.*'{stream}'.*stayed UPDATING.*consumerTimeoutMs"):
        ensure_consumer(client, stream, "app", timeout_s=0.5, poll_s=0.05)
    assert client.list_stream_consumers(StreamARN=stream_arn(client, stream))["Consumers"] == []


def test_consumer_errors_name_stream_and_consumer(efo_server, client, make_stream):
    with pytest.raises(KinesisSourceError, match="'no-such-stream'.*streamName"):
        ensure_consumer(client, "no-such-stream", "app", timeout_s=5, poll_s=0.05)
    stream = make_stream(1)
    efo_server.consumer_limit = 1
    ensure_consumer(client, stream, "first", timeout_s=10, poll_s=0.05)
    with pytest.raises(ConsumerError, match=f"'second'.*'{stream}'.*has 1 consumers \\(first\\).*at most 20"):
        ensure_consumer(client, stream, "second", timeout_s=10, poll_s=0.05)
    # several registering at once is another limit, said as such
    efo_server.consumer_limit, efo_server.activation_delay_s = 6, 60
    for n in range(4):
        client.register_stream_consumer(StreamARN=stream_arn(client, stream), ConsumerName=f"busy{n}")
    efo_server.consumer_limit = 6  # first + 4 CREATING + the next: over
    client.register_stream_consumer(StreamARN=stream_arn(client, stream), ConsumerName="busy4")
    with pytest.raises(ConsumerError, match="5 consumers of the stream are being registered at once"):
        ensure_consumer(client, stream, "third", timeout_s=10, poll_s=0.05)
    for n in range(5):
        client.deregister_stream_consumer(StreamARN=stream_arn(client, stream), ConsumerName=f"busy{n}")
    efo_server.consumer_limit = 20
    efo_server.activation_delay_s = 60
    with pytest.raises(ConsumerError, match="CREATING, not ACTIVE"):
        ensure_consumer(client, stream, "slow", timeout_s=0.3, poll_s=0.05)
