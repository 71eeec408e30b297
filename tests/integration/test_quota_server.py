"""The quota-enforcing test server itself: it refuses what real Kinesis refuses, and only that."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from collections import Counter

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.support.producer import Producer
from tests.support.proxy import TRUNCATED, FaultProxy
from tests.support.quota import LIMIT_EXCEEDED, MIB, Feeder, QuotaProxy, Quotas
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


def test_a_request_cut_short_by_its_clients_death_is_not_counted_as_a_call(kinesis_backend, make_stream):
    """A client SIGKILLed between its header and body writes leaves a body shorter than its
    Content-Length. No server acts on it: it is marked truncated, answered by a closed
    connection, and not taken for a call that named no shard (which would hide a real one)."""
    stream = make_stream(1)
    body = json.dumps({"StreamName": stream, "ShardId": "shardId-000000000000",
                       "ShardIteratorType": "LATEST"}).encode()
    with QuotaProxy(kinesis_backend) as q:
        port = int(q.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(
                b"POST / HTTP/1.1\r\nHost: x\r\nX-Amz-Target: Kinesis_20131202.GetShardIterator\r\n"
                b"Content-Type: application/x-amz-json-1.1\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:10]
            )
            sock.shutdown(socket.SHUT_WR)  # the client is gone mid-body
            assert sock.recv(1024) == b""  # closed without an answer
        wait_for(lambda: q.calls("GetShardIterator"), timeout=5, interval=0.05, what="the cut request seen")
        assert [s.injected for s in q.calls("GetShardIterator")] == [TRUNCATED]
        assert q.unattributed() == []


# -- writes ---------------------------------------------------------------------------------------


def _rate_exceeded(stream: str, shard: str) -> str:
    return f"Rate exceeded for shard {shard} in stream {stream} under account 123456789012."


def _contents(kinesis, stream: str, shard: str, at_least: int) -> list[bytes]:
    """The data of every record of the shard, read on the backend itself: pages from the start
    until ``at_least`` records are read and a page at the tip is empty (so nothing more is there)."""
    it = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard, ShardIteratorType="TRIM_HORIZON")[
        "ShardIterator"]
    got: list[bytes] = []

    def at_the_tip() -> bool:
        nonlocal it
        page = kinesis.get_records(ShardIterator=it)
        it = page["NextShardIterator"]
        got.extend(r["Data"] for r in page["Records"])
        return len(got) >= at_least and not page["Records"]

    wait_for(at_the_tip, timeout=10, interval=0.05, what=f"{at_least} records in {shard}")
    return got


def _records(tag: str, n: int, size: int = 0) -> list[dict]:
    """``n`` records with distinct data (padded to ``size`` bytes with their partition key)."""
    return [
        {"Data": f"{tag}-{i}".encode().ljust(size - len(f"k{i}"), b"."), "PartitionKey": f"k{i}"} for i in range(n)
    ]


def _written(records: list[dict], answer: dict) -> list[tuple[int, bytes]]:
    """``(sequence number, data)`` of the records the answer says were written."""
    return [(int(e["SequenceNumber"]), r["Data"]) for r, e in zip(records, answer["Records"], strict=True)
            if "SequenceNumber" in e]


def test_thirteen_hundred_records_at_once_to_a_shard_are_partly_refused(kinesis, kinesis_backend, make_stream):
    """Three writers put 1,300 records to one shard at the same moment: the one-second bucket holds
    1,000 and what refills while the requests come in; each request's records are judged in order,
    so its refused ones are its last; they are not written, the others are, in their order."""
    stream = make_stream(1)
    shard = _shard(kinesis, stream)
    batches = [_records(f"w{w}", n) for w, n in enumerate((500, 500, 300))]
    answers: list[dict] = [{}] * 3
    with QuotaProxy(kinesis_backend) as q:
        clients = [_raw_client(q.url) for _ in batches]
        together = threading.Barrier(len(batches))

        def put(w: int) -> None:
            together.wait()
            answers[w] = clients[w].put_records(StreamName=stream, Records=batches[w])

        writers = [threading.Thread(target=put, args=(w,)) for w in range(len(batches))]
        for t in writers:
            t.start()
        for t in writers:
            t.join(timeout=30)
        arrivals = [s.at for s in q.calls("PutRecords")]
    written = [w for records, answer in zip(batches, answers, strict=True) for w in _written(records, answer)]
    refused = [e for answer in answers for e in answer["Records"] if "ErrorCode" in e]
    assert len(written) + len(refused) == 1300
    room = 1000 + 1000 * (max(arrivals) - min(arrivals)) + 1  # the bucket and its refill meanwhile
    assert 1000 <= len(written) <= room
    # Some are refused unless the requests came so far apart (a loaded machine) that the refill
    # took them all
    assert refused or room >= 1300
    assert all(e == {"ErrorCode": THROTTLED, "ErrorMessage": _rate_exceeded(stream, shard)} for e in refused)
    for records, answer in zip(batches, answers, strict=True):
        failed = ["ErrorCode" in e for e in answer["Records"]]
        assert answer["FailedRecordCount"] == sum(failed)
        assert failed == sorted(failed)  # written ones first: judged in order, nothing refills within a request
        seqs = [seq for seq, _ in _written(records, answer)]
        assert seqs == sorted(seqs)  # forwarded in one request, in its order
    assert len(q.written(stream, shard)) == len(written)
    assert len(q.refused_records(stream, shard)) == len(refused)
    assert _contents(kinesis, stream, shard, len(written)) == [data for _, data in sorted(written)]


def test_eight_hundred_records_a_second_to_a_shard_are_not_refused(kinesis, kinesis_backend, make_stream):
    """1,200 records in 1.5 s are more than the bucket holds: the refill lets them all through."""
    stream = make_stream(1)
    shard = _shard(kinesis, stream)
    answers: list[dict] = []
    with QuotaProxy(kinesis_backend) as q:
        client = _raw_client(q.url)
        rounds = iter(range(15))
        codes = _paced(10, 1.5, lambda: answers.append(
            client.put_records(StreamName=stream, Records=_records(f"r{next(rounds)}", 80))))
    assert codes == [None] * 15
    assert [a["FailedRecordCount"] for a in answers] == [0] * 15
    assert len(q.written(stream, shard)) == 1200 and q.refused_records() == []
    assert 700 <= q.peak_write_rate(window_s=1.5) <= 800


def test_two_mib_at_once_to_a_shard_writes_the_first_mib(kinesis, kinesis_backend, make_stream):
    """128 records of 16 KiB (data and partition key) in one request: the 1 MiB bucket takes the
    first 64; the other 64 are refused, though the record count is far below its quota."""
    stream = make_stream(1)
    shard = _shard(kinesis, stream)
    records = _records("big", 128, size=16 * 1024)
    with QuotaProxy(kinesis_backend) as q:
        answer = _raw_client(q.url).put_records(StreamName=stream, Records=records)
    failed = ["ErrorCode" in e for e in answer["Records"]]
    assert failed == [False] * 64 + [True] * 64
    assert answer["FailedRecordCount"] == 64
    assert sum(n for _, n in q.written(stream, shard)) == MIB
    assert [n for _, n in q.refused_records(stream, shard)] == [16 * 1024] * 64
    assert q.peak_write_rate(unit="bytes") == MIB
    assert _contents(kinesis, stream, shard, 64) == [r["Data"] for r in records[:64]]


def test_the_write_quota_counts_each_record_on_its_shard(kinesis, kinesis_backend, make_stream):
    """One partition key, every other record sent elsewhere by an explicit hash key: at 2 records/s per
    shard, 2 are written on each shard. A PutRecord to a spent shard is refused as a call until the
    bucket refills."""
    stream = make_stream(2)
    listed = kinesis.list_shards(StreamName=stream)["Shards"]
    # a key whose MD5 is in the upper half of the key space, the second shard's
    key = next(k for k in (f"p{i}" for i in range(100)) if hashlib.md5(k.encode()).digest()[0] >= 0x80)
    records = [{"Data": f"d{i}".encode(), "PartitionKey": key} for i in range(20)]
    for rec in records[1::2]:
        rec["ExplicitHashKey"] = listed[0]["HashKeyRange"]["StartingHashKey"]
    with QuotaProxy(kinesis_backend, Quotas(put_records_per_shard=2)) as q:
        client = _raw_client(q.url)
        answer = client.put_records(StreamName=stream, Records=records)
        home = answer["Records"][0]["ShardId"]
        assert home == listed[1]["ShardId"]
        assert Counter(e.get("ShardId") for e in answer["Records"] if "SequenceNumber" in e) == {
            s["ShardId"]: 2 for s in listed}
        assert {e.get("ErrorMessage") for e in answer["Records"] if "ErrorCode" in e} == {
            _rate_exceeded(stream, s["ShardId"]) for s in listed}
        with pytest.raises(ClientError) as refused:
            client.put_record(StreamName=stream, Data=b"one", PartitionKey=key)
        assert refused.value.response["Error"] == {"Code": THROTTLED, "Message": _rate_exceeded(stream, home)}

        def accepted() -> bool:
            try:
                return client.put_record(StreamName=stream, Data=b"one", PartitionKey=key)["ShardId"] == home
            except ClientError:
                return False

        wait_for(accepted, timeout=5, interval=0.1, what="a token refilled")
    assert q.refused(where=lambda s: s.operation == "PutRecord") >= 1
    assert len(q.written(stream, home)) == 3


@pytest.mark.backends("kinesis-local")  # moto's PutRecords keeps writing a split parent
def test_the_write_quota_follows_a_reshard(kinesis, kinesis_backend, make_stream):
    """After a reshard, the first answer naming a child shard makes the proxy list the shards again,
    so the next request is judged on the children, not on the parent (listed as open before)."""
    stream = make_stream(1)
    with QuotaProxy(kinesis_backend, Quotas(put_records_per_shard=5)) as q:
        client = _raw_client(q.url)
        client.put_records(StreamName=stream, Records=_records("before", 1))  # the proxy lists the parent

        def open_shards() -> list[dict]:
            return [s for s in kinesis.list_shards(StreamName=stream)["Shards"]
                    if "EndingSequenceNumber" not in s["SequenceNumberRange"]]

        kinesis.update_shard_count(StreamName=stream, TargetShardCount=2, ScalingType="UNIFORM_SCALING")
        children = wait_for(lambda: len(open_shards()) == 2 and open_shards(), timeout=30, what="two children")
        to = [c["HashKeyRange"]["StartingHashKey"] for c in children]
        first = client.put_records(StreamName=stream, Records=[
            {"Data": b"x", "PartitionKey": "k", "ExplicitHashKey": to[0]}])
        second = client.put_records(StreamName=stream, Records=[
            {"Data": b"y", "PartitionKey": "k", "ExplicitHashKey": to[1]} for _ in range(10)])
    assert first["Records"][0]["ShardId"] == children[0]["ShardId"]  # judged on the parent, written on a child
    # judged on the second child's own budget: 5 written there, 5 refused naming it
    assert [e.get("ShardId") for e in second["Records"][:5]] == [children[1]["ShardId"]] * 5
    assert second["Records"][5:] == [
        {"ErrorCode": THROTTLED, "ErrorMessage": _rate_exceeded(stream, children[1]["ShardId"])}] * 5
    assert len(q.refused_records(stream, children[1]["ShardId"])) == 5


def test_failed_records_are_answered_in_place_and_not_written(kinesis, kinesis_backend, make_stream):
    """30% of a 500-record request failed by the rule: those entries carry the error in their places,
    and the stream holds exactly the others, in the request's order."""
    stream = make_stream(1)
    shard = _shard(kinesis, stream)
    records = _records("f", 500)
    with FaultProxy(kinesis_backend) as proxy:
        proxy.fail_records(0.3)
        answer = _raw_client(proxy.url).put_records(StreamName=stream, Records=records)
    failed = [e for e in answer["Records"] if "ErrorCode" in e]
    assert 100 <= len(failed) <= 200  # 150 expected
    assert answer["FailedRecordCount"] == len(failed) == proxy.failed_records("InternalFailure")
    assert all(e == {"ErrorCode": "InternalFailure", "ErrorMessage": "Internal service failure."} for e in failed)
    written = _written(records, answer)
    assert [seq for seq, _ in written] == sorted(seq for seq, _ in written)
    assert _contents(kinesis, stream, shard, len(written)) == [data for _, data in written]


def test_records_failed_all_are_answered_without_the_backend(kinesis, kinesis_backend, make_stream):
    """A rule for one stream, failing every record: nothing is forwarded; other streams, and the
    stream after ``clear()``, are written as usual."""
    stream, other = make_stream(1), make_stream(1)
    shard = _shard(kinesis, stream)
    with FaultProxy(kinesis_backend) as proxy:
        client = _raw_client(proxy.url)
        proxy.fail_records(1.0, THROTTLED, stream=stream)
        refused = client.put_records(StreamName=stream, Records=_records("no", 10))
        elsewhere = client.put_records(StreamName=other, Records=_records("other", 10))
        proxy.clear()
        after = client.put_records(StreamName=stream, Records=_records("yes", 10))
    assert refused["FailedRecordCount"] == 10
    assert refused["Records"] == [{"ErrorCode": THROTTLED, "ErrorMessage": _rate_exceeded(stream, shard)}] * 10
    assert elsewhere["FailedRecordCount"] == after["FailedRecordCount"] == 0
    assert proxy.failed_records() == proxy.failed_records(THROTTLED) == 10
    assert _contents(kinesis, stream, shard, 10) == [f"yes-{i}".encode() for i in range(10)]
