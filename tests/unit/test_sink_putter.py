"""The sink's task loop against an in-process fake of ``PutRecords`` (one module's unit tests;
tests/integration/test_sink.py writes through real Spark to real servers)."""

from __future__ import annotations

import random
import re
from collections import Counter, defaultdict

import pytest

from kinesis_source.aws.kinesis import ShardInfo
from kinesis_source.errors import SinkInputError, SinkWriteError
from kinesis_source.sink.options import SinkOptions
from kinesis_source.sink.pacing import WriteBudget
from kinesis_source.sink.putter import Putter
from kinesis_source.sink.rows import Columns, user_record
from kinesis_source.sink.shards import ShardMap

COLUMNS = Columns("data", False, "partitionKey", "explicitHashKey")
HALF = 2**127
SHARDS = ShardMap.of([
    ShardInfo("shard-0", hash_range=(0, HALF - 1)),
    ShardInfo("shard-1", hash_range=(HALF, 2**128 - 1)),
])


class Clock:
    """Time that passes only when the putter sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeKinesis:
    """Accepts records into per-shard lists; refuses a seeded fraction of them."""

    def __init__(self, refuse: float = 0.0, code: str = "InternalFailure", seed: int = 3) -> None:
        self.refuse = refuse
        self.code = code
        self.rng = random.Random(seed)
        self.shards: dict[str, list[dict]] = defaultdict(list)
        self.requests: list[list[dict]] = []

    def put_records(self, StreamName, Records):  # noqa: N803 - boto3's names
        self.requests.append(Records)
        out = []
        for rec in Records:
            if self.rng.random() < self.refuse:
                out.append({"ErrorCode": self.code, "ErrorMessage": "refused"})
                continue
            shard = SHARDS.shard_of(int(rec.get("ExplicitHashKey") or _md5(rec["PartitionKey"])))
            self.shards[shard].append(rec)
            out.append({"ShardId": shard, "SequenceNumber": str(len(self.shards[shard]))})
        return {"FailedRecordCount": sum("ErrorCode" in r for r in out), "Records": out}


def _md5(key: str) -> int:
    from kinesis_source.kpl import effective_hash_key

    return effective_hash_key(key)


def rows(n: int, keys: int = 7, size: int = 10):
    return [user_record(i, f"k{i % keys}", f"{i}".ljust(size, ".").encode(), None, COLUMNS, "s") for i in range(n)]


def putter(client, clock=None, **options) -> Putter:
    opts = SinkOptions.parse({"streamName": "s", **{k: str(v) for k, v in options.items()}})
    clock = clock or Clock()
    return Putter(client, opts, SHARDS, clock=clock, sleep=clock.sleep)


def per_key(client: FakeKinesis) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for records in client.shards.values():
        for rec in records:
            out[rec["PartitionKey"]].append(int(rec["Data"].rstrip(b".")))
    return out


def test_refused_records_are_retried_until_every_row_is_written_once_in_its_keys_order():
    client = FakeKinesis(refuse=0.3)
    report = putter(client, maxRecordRetries=30).write(rows(3000))
    order = per_key(client)
    assert sorted(i for seen in order.values() for i in seen) == list(range(3000))
    assert all(seen == sorted(seen) for seen in order.values())
    assert report.rows == report.records == 3000
    assert report.refused["InternalFailure"] > 500


def test_with_key_order_a_request_holds_one_record_per_key_and_without_it_fills_up():
    ordered = FakeKinesis()
    putter(ordered).write(rows(500, keys=5))
    assert max(len(r) for r in ordered.requests) == 5
    assert all(len({x["PartitionKey"] for x in r}) == len(r) for r in ordered.requests)
    loose = FakeKinesis()
    putter(loose, preserveKeyOrder="false").write(rows(500, keys=5))
    assert [len(r) for r in loose.requests] == [500]


def test_a_record_refused_past_its_retries_fails_the_task_naming_stream_count_and_code():
    client = FakeKinesis(refuse=1.0, code="ProvisionedThroughputExceededException")
    with pytest.raises(SinkWriteError) as err:
        putter(client, maxRecordRetries=2).write(rows(3, keys=3))
    text = str(err.value)
    given_up, waiting = map(int, re.search(r"(\d+) records could not be written.* (\d+) more", text).groups())
    assert given_up >= 1 and given_up + waiting == 3
    assert "to Kinesis stream 's'" in text and "refused each of them 3 times" in text
    assert "ProvisionedThroughputExceededException x" in text and "maxRecordRetries" in text
    attempts = Counter(r["PartitionKey"] for request in client.requests for r in request)
    assert max(attempts.values()) == 3  # the first attempt and two retries, never more


def test_writes_are_paced_to_each_shards_byte_and_record_rates():
    clock = Clock()
    client = FakeKinesis()
    sent: list[tuple[float, list[dict]]] = []
    original = client.put_records

    def timed(StreamName, Records):  # noqa: N803
        sent.append((clock.now, Records))
        return original(StreamName, Records)

    client.put_records = timed
    putter(client, clock, maxWriteRatePerShard="100KiB").write(rows(2000, keys=50, size=1000))
    assert 8 < clock.now < 12  # ~1 MB per shard at 100 KiB/s, the first second's bucket included
    for shard in ("shard-0", "shard-1"):
        times = [t for t, records in sent for r in records if SHARDS.shard_of(_md5(r["PartitionKey"])) == shard]
        for start in range(int(clock.now)):
            in_window = sum(1 for t in times if start <= t < start + 1)
            assert in_window * 1002 <= 2 * 100 * 1024  # a full bucket plus a second's refill


def test_a_refusal_for_throughput_slows_the_shard_and_the_rate_comes_back():
    budget = WriteBudget(1000.0, 1000.0)
    assert budget.take("a", 10, 0.0)
    budget.refused("a", 0.0)
    assert budget.share("a") == pytest.approx(0.7)
    assert not budget.take("a", 10, 0.0)
    assert budget.wait_s("a", 10, 0.0) == pytest.approx(10 / 700)
    budget.take("a", 1, 10.0)
    assert budget.share("a") == 1.0


def test_an_answer_refusing_many_records_of_a_shard_cuts_its_rate_once():
    client = FakeKinesis()
    first = True
    original_put = client.put_records

    def refuse_the_first_request(StreamName, Records):  # noqa: N803
        nonlocal first
        if first:
            first = False
            code = {"ErrorCode": "ProvisionedThroughputExceededException", "ErrorMessage": "x"}
            return {"FailedRecordCount": len(Records), "Records": [code] * len(Records)}
        return original_put(StreamName, Records)

    client.put_records = refuse_the_first_request
    p = putter(client)
    p.write(rows(40, keys=40))
    assert p._budget.share("shard-0") == pytest.approx(0.7, abs=0.05)  # one cut, not one per record
    assert p._budget.share("shard-1") == pytest.approx(0.7, abs=0.05)
    assert p.report.refused["ProvisionedThroughputExceededException"] == 40


def test_the_refill_after_a_burst_from_a_full_bucket_counts_from_its_answer():
    budget = WriteBudget(1000.0, 1000.0)
    assert budget.take("a", 1000, 0.0)  # the whole bucket, sent at 0.0
    budget.answered("a", 0.05)  # Kinesis got it somewhere before 0.05
    assert budget.wait_s("a", 100, 0.05) == pytest.approx(0.1)  # not 0.05: refill from the answer
    assert budget.take("a", 100, 0.1501)
    budget.answered("a", 0.2)  # not from a full bucket: no effect
    assert budget.wait_s("a", 100, 0.2) == pytest.approx(0.05, abs=0.001)


def test_aggregates_group_one_shards_rows_below_the_size_limit():
    client = FakeKinesis()
    putter(client, aggregate="true", aggregationMaxBytes="2000").write(rows(400, keys=40, size=20))
    from kinesis_source import kpl

    users = []
    for shard, records in client.shards.items():
        for rec in records:
            assert len(rec["Data"]) + len(rec["PartitionKey"].encode()) <= 2000
            for key, data, _ in kpl.decode(rec["Data"]):
                assert SHARDS.shard_of(_md5(key)) == shard
                users.append(int(data.rstrip(b".")))
    assert sorted(users) == list(range(400))
    assert len(client.requests[0]) < 20


@pytest.mark.parametrize(
    ("key", "data", "hash_key", "says"),
    [
        (None, b"x", None, "column 'partitionKey' is null"),
        ("", b"x", None, "has 0 characters"),
        ("k" * 257, b"x", None, "has 257 characters"),
        ("k", None, None, "column 'data' is null"),
        ("k", b"x" * (1024 * 1024), None, "makes a record of 1048577 bytes"),
        ("k", b"x", "12a", "must be a decimal integer from 0 to 2^128-1"),
        ("k", b"x", str(2**128), "must be a decimal integer from 0 to 2^128-1"),
    ],
)
def test_a_row_breaking_a_record_rule_is_named_with_its_column(key, data, hash_key, says):
    with pytest.raises(SinkInputError) as err:
        user_record(7, key, data, hash_key, COLUMNS, "s")
    assert says in str(err.value) and "Row 7" in str(err.value) and "'s'" in str(err.value)


def test_the_schema_check_names_missing_mistyped_and_extra_columns():
    from pyspark.sql.types import IntegerType, StringType, StructField, StructType

    from kinesis_source.sink.rows import check_schema

    def schema(**cols):
        return StructType([StructField(n, t) for n, t in cols.items()])

    ok = check_schema(schema(Data=StringType(), partitionkey=StringType()), "s")
    assert (ok.data, ok.partition_key, ok.data_is_text) == ("Data", "partitionkey", True)
    for bad, says in [
        (schema(value=StringType(), partitionKey=StringType()), "needs column 'data'"),
        (schema(data=StringType(), partitionKey=IntegerType()), "column 'partitionKey' is int"),
        (schema(data=StringType(), partitionKey=StringType(), extra=StringType()), "also has 'extra'"),
    ]:
        with pytest.raises(SinkInputError, match=says):
            check_schema(bad, "s")


def test_a_record_larger_than_the_bucket_goes_when_it_is_full_and_the_rate_still_holds():
    budget = WriteBudget(100.0, 1000.0)
    assert budget.take("a", 500, 0.0)  # full bucket: goes, overdrawing it by 400
    assert not budget.take("a", 10, 4.0)
    assert budget.wait_s("a", 10, 4.0) == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("code", "says"),
    [
        ("KMSAccessDeniedException", "may not use the stream's KMS key (kms:GenerateDataKey)"),
        ("KMSDisabledException", "the stream's KMS key is disabled"),
        ("AccessDeniedException", "may not call PutRecords on it (IAM action kinesis:PutRecords)"),
    ],
)
def test_a_write_refused_for_its_key_or_permission_says_what_to_grant(code, says):
    from botocore.exceptions import ClientError

    from kinesis_source.errors import KinesisSourceError

    class Refusing:
        def put_records(self, StreamName, Records):  # noqa: N803
            raise ClientError({"Error": {"Code": code, "Message": "no"}}, "PutRecords")

    with pytest.raises(KinesisSourceError) as err:
        putter(Refusing()).write(rows(3))
    assert "Cannot write to Kinesis stream 's'" in str(err.value) and says in str(err.value)


def test_other_call_errors_stay_as_botocore_raised_them():
    from botocore.exceptions import ClientError

    class Failing:
        def put_records(self, StreamName, Records):  # noqa: N803
            raise ClientError({"Error": {"Code": "InvalidArgumentException", "Message": "bad"}}, "PutRecords")

    with pytest.raises(ClientError, match="InvalidArgumentException"):
        putter(Failing()).write(rows(3))


class TwiceReshardedKinesis(FakeKinesis):
    """Both shards split in two before the first request, and every child split again right
    after it: the first request's aggregates land on children that have closed by the time the
    task lists the stream."""

    QUARTER = 2**126

    def __init__(self) -> None:
        super().__init__()
        q = self.QUARTER
        self.closed = {"shard-0": (0, HALF - 1), "shard-1": (HALF, 2**128 - 1)}
        self.open = {"shard-2": (0, q - 1), "shard-3": (q, HALF - 1),
                     "shard-4": (HALF, HALF + q - 1), "shard-5": (HALF + q, 2**128 - 1)}

    def put_records(self, StreamName, Records):  # noqa: N803 - boto3's names
        out = []
        for rec in Records:
            key = int(rec.get("ExplicitHashKey") or _md5(rec["PartitionKey"]))
            shard = next(s for s, (lo, hi) in self.open.items() if lo <= key <= hi)
            self.shards[shard].append(rec)
            out.append({"ShardId": shard, "SequenceNumber": str(len(self.shards[shard]))})
        if len(self.open) == 4:  # the children split again: each into its halves
            children = {}
            for i, (shard, (lo, hi)) in enumerate(sorted(self.open.items())):
                mid = (lo + hi) // 2
                children[f"shard-{6 + 2 * i}"] = (lo, mid)
                children[f"shard-{7 + 2 * i}"] = (mid + 1, hi)
                self.closed[shard] = (lo, hi)
            self.open = children
        return {"FailedRecordCount": 0, "Records": out}

    def get_paginator(self, op):
        assert op == "list_shards"
        fake = self

        class Pages:
            def paginate(self, StreamName):  # noqa: N803 - boto3's names
                shards = [
                    {"ShardId": s, "HashKeyRange": {"StartingHashKey": str(lo), "EndingHashKey": str(hi)},
                     "SequenceNumberRange": {"StartingSequenceNumber": "1",
                                             **({"EndingSequenceNumber": "9"} if s in fake.closed else {})}}
                    for s, (lo, hi) in {**fake.closed, **fake.open}.items()
                ]
                return [{"Shards": shards}]

        return Pages()


def test_an_aggregate_landed_on_a_shard_that_closed_again_sends_again_what_its_range_does_not_hold():
    from kinesis_source import kpl

    client = TwiceReshardedKinesis()
    report = putter(client, aggregate="true").write(rows(400, keys=40))
    ranges = {**client.closed, **client.open}
    kept = []  # what readers keep: the user records within the range of the shard they landed on
    for shard, records in client.shards.items():
        lo, hi = ranges[shard]
        for rec in records:
            for key, data, hash_key in kpl.decode(rec["Data"]):
                if lo <= kpl.effective_hash_key(key, hash_key) <= hi:
                    kept.append(int(data.rstrip(b".")))
    assert sorted(kept) == list(range(400)), "every row kept once by the readers of the shard it landed on"
    assert report.rerouted_rows > 0 and report.shard_map_refreshes >= 1
