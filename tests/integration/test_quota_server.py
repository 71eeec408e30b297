"""The quota-enforcing test server itself: it refuses what real Kinesis refuses, and only that."""

from __future__ import annotations

import time

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.support.producer import Producer
from tests.support.quota import LIMIT_EXCEEDED, Feeder, QuotaProxy, Quotas
from tests.support.waiting import wait_for

THROTTLED = "ProvisionedThroughputExceededException"


def _raw_client(url: str, key: str = "local"):
    """A client without retries, so every refusal reaches the test."""
    return boto3.client(
        "kinesis", endpoint_url=url, region_name="us-east-1", aws_access_key_id=key,
        aws_secret_access_key="local", config=Config(retries={"total_max_attempts": 1, "mode": "standard"}),
    )


def _paced(rate: float, seconds: float, call) -> list[str | None]:
    """Call ``call`` ``rate`` times a second for ``seconds``; the error code of each call."""
    codes: list[str | None] = []
    start = time.monotonic()
    for n in range(int(rate * seconds)):
        time.sleep(max(0.0, start + n / rate - time.monotonic()))  # pacing to the rate
        try:
            call()
            codes.append(None)
        except ClientError as exc:
            codes.append(exc.response["Error"]["Code"])
    return codes


def _shard(kinesis, stream: str) -> str:
    return kinesis.list_shards(StreamName=stream)["Shards"][0]["ShardId"]


@pytest.mark.parametrize("rate, refused", [(6, True), (4, False)])
def test_get_records_beyond_five_calls_a_second_on_a_shard_is_throttled(
    kinesis, kinesis_backend, make_stream, rate, refused
):
    stream = make_stream(1)
    Producer(kinesis, stream).put(5)
    with QuotaProxy(kinesis_backend) as q:
        client = _raw_client(q.url)
        it = client.get_shard_iterator(StreamName=stream, ShardId=_shard(kinesis, stream),
                                       ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        codes = _paced(rate, 3, lambda: client.get_records(ShardIterator=it, Limit=1))
    assert (THROTTLED in codes) is refused, codes
    assert set(codes) <= {None, THROTTLED}
    assert q.refused() == codes.count(THROTTLED)


@pytest.mark.parametrize("rate, refused", [(6, True), (4, False)])
def test_get_shard_iterator_beyond_five_calls_a_second_on_a_shard_is_throttled(
    kinesis, kinesis_backend, make_stream, rate, refused
):
    stream = make_stream(2)
    shard = _shard(kinesis, stream)
    with QuotaProxy(kinesis_backend) as q:
        client = _raw_client(q.url)
        codes = _paced(rate, 3, lambda: client.get_shard_iterator(
            StreamName=stream, ShardId=shard, ShardIteratorType="LATEST"))
    assert (THROTTLED in codes) is refused, codes
    # The budget is per shard: the other shard is untouched and every call is counted on its own.
    assert {s.shard for s in q.calls("GetShardIterator")} == {(stream, shard)}


def test_the_call_budget_is_shared_by_every_caller_of_a_shard(kinesis, kinesis_backend, make_stream):
    """Two applications at 3 calls/s each are 6 calls/s on the shard: one of them is refused."""
    stream = make_stream(1)
    shard = _shard(kinesis, stream)
    with QuotaProxy(kinesis_backend) as q:
        a, b = _raw_client(q.url, "app-a"), _raw_client(q.url, "app-b")

        def both():
            for client in (a, b):
                try:
                    client.get_shard_iterator(StreamName=stream, ShardId=shard, ShardIteratorType="LATEST")
                except ClientError as exc:
                    assert exc.response["Error"]["Code"] == THROTTLED

        _paced(3, 3, both)
        assert q.refused() > 0
        assert len(q.calls(where=lambda s: s.access_key == "app-a")) == 9
        # 9 calls each within 2.7 s: in a 3-second window, 3/s for one caller, 6/s on the shard.
        assert q.peak_rate("GetShardIterator", window_s=3.0, where=lambda s: s.access_key == "app-b") == 3.0
        assert q.peak_rate("GetShardIterator", window_s=3.0) == 6.0


def test_a_large_read_empties_the_byte_bucket_until_it_refills(kinesis, kinesis_backend, make_stream):
    """After a response bigger than the bucket, calls are refused until the rate has refilled it:
    AWS' 'after a 10 MiB response, calls in the next 5 s are throttled', scaled down."""
    stream = make_stream(1)
    shard = _shard(kinesis, stream)
    records = [{"Data": b"x" * 10_000, "PartitionKey": "k"} for _ in range(30)]  # 300 KB
    kinesis.put_records(StreamName=stream, Records=records)
    quotas = Quotas(get_records_bytes_per_s=100_000, get_records_burst_bytes=100_000)
    with QuotaProxy(kinesis_backend, quotas) as q:
        client = _raw_client(q.url)
        it = client.get_shard_iterator(StreamName=stream, ShardId=shard, ShardIteratorType="TRIM_HORIZON")[
            "ShardIterator"]
        first = client.get_records(ShardIterator=it)
        assert len(first["Records"]) == 30  # one response may overdraw the bucket
        read_at = time.monotonic()
        with pytest.raises(ClientError) as refused:
            client.get_records(ShardIterator=first["NextShardIterator"])
        assert refused.value.response["Error"]["Code"] == THROTTLED

        def accepted() -> bool:
            try:
                client.get_records(ShardIterator=first["NextShardIterator"])
                return True
            except ClientError:
                return False

        wait_for(accepted, timeout=10, interval=0.25, what="the bucket refilled")
        # 300 KB overdrew a 100 KB bucket by 200 KB: at 100 KB/s it refills in about 2 s.
        assert time.monotonic() - read_at >= 1.5
        assert q.bytes_read[(stream, shard)] >= 300_000


def test_control_plane_calls_beyond_the_account_quota_get_limit_exceeded(kinesis_backend, make_stream):
    stream = make_stream(1)
    with QuotaProxy(kinesis_backend, Quotas(control=(("DescribeStreamSummary", 3, "account"),))) as q:
        client = _raw_client(q.url)
        codes = _paced(8, 1, lambda: client.describe_stream_summary(StreamName=stream))
    assert codes.count(LIMIT_EXCEEDED) >= 4 and codes[:3] == [None] * 3
    assert q.refused() == codes.count(LIMIT_EXCEEDED)


def test_get_records_are_counted_against_their_shard_and_client_kind(kinesis, kinesis_backend, make_stream):
    """Iterators from answers (also the next iterator of each page) map every GetRecords to its shard."""
    stream = make_stream(2)
    shards = [s["ShardId"] for s in kinesis.list_shards(StreamName=stream)["Shards"]]
    with QuotaProxy(kinesis_backend) as q, Feeder(kinesis, stream, shards[:1], per_shard_rate=20) as feed:
        client = _raw_client(q.url)
        it = client.get_shard_iterator(StreamName=stream, ShardId=shards[0], ShardIteratorType="TRIM_HORIZON")[
            "ShardIterator"]
        got = 0

        def read_more() -> bool:
            nonlocal it, got
            page = client.get_records(ShardIterator=it)
            it, got = page["NextShardIterator"], got + len(page["Records"])
            return got >= 20

        wait_for(read_more, timeout=20, interval=0.5, what="20 fed records")
    assert {s.shard for s in q.calls("GetRecords")} == {(stream, shards[0])}
    assert {s.client for s in q.calls("GetRecords")} == {"sync"}
    assert all(shard == shards[0] for shard, _, _ in feed.sent)
