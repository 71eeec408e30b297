"""The sink, written to through real Spark (``local[2]``) on moto and kinesis-local, and read
back by plain boto3 calls, aws-kinesis-agg and this project's source."""

from __future__ import annotations

import base64
from collections import Counter, defaultdict
from typing import Any

import pytest

from tests.support.proxy import FaultProxy
from tests.support.quota import QuotaProxy, Quotas
from tests.support.spark_query import read_available_now, stop_quietly
from tests.support.waiting import wait_for

pytestmark = pytest.mark.spark


@pytest.fixture
def sink_proxy(kinesis_backend):
    """A fault proxy in front of the backend, for the sink's writes: moto server's concurrent
    ``PutRecords`` to one shard can lose a record, and the proxy forwards one stream's writes
    one at a time."""
    with FaultProxy(kinesis_backend) as proxy:
        yield proxy


def options_for(url: str) -> dict[str, str]:
    """What a write needs to reach the server at ``url``."""
    return {"endpointUrl": url, "region": "us-east-1", "awsAccessKeyId": "local", "awsSecretKey": "local"}


@pytest.fixture
def sink_options(sink_proxy):
    """What a write needs to reach the backend under test (through ``sink_proxy``)."""
    return options_for(sink_proxy.url)


def stream_records(kinesis, stream: str) -> list[dict]:
    """Every record of ``stream``, shard by shard (parents before children), each shard's in
    its order, read with plain boto3 calls."""
    shards = kinesis.list_shards(StreamName=stream)["Shards"]
    out = []
    for shard in sorted(shards, key=lambda s: int(s["SequenceNumberRange"]["StartingSequenceNumber"])):
        iterator = kinesis.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        while iterator:
            page = kinesis.get_records(ShardIterator=iterator, Limit=10000)
            out += [{**r, "ShardId": shard["ShardId"]} for r in page["Records"]]
            if not page["Records"] and page.get("MillisBehindLatest", 0) == 0:
                break
            iterator = page.get("NextShardIterator")
    return out


def numbered_rows(n: int, keys: int) -> list[tuple[str, str]]:
    """(partitionKey, data) rows; data is the row's number."""
    return [(f"key-{i % keys}", str(i)) for i in range(n)]


def number(data: bytes) -> int:
    """The row number in a record's data (``n``, or ``task:n`` as :func:`write_batch` tags it)."""
    return int(bytes(data).rstrip(b".").split(b":")[-1])


def written_numbers_by_key(records: list[tuple[str, bytes]]) -> dict[str, list[int]]:
    """Each key's row numbers in the order the stream holds them."""
    out: dict[str, list[int]] = defaultdict(list)
    for key, data in records:
        out[key].append(number(data))
    return out


def assert_each_tasks_rows_in_order(records: list[tuple[str, bytes]]) -> None:
    """Within each task's rows (tagged ``task:n`` by :func:`write_batch`), every key's rows are
    in row order, as the stream holds them."""
    by_task_and_key: dict[tuple[bytes, str], list[int]] = defaultdict(list)
    for key, data in records:
        task = bytes(data).split(b":")[0]
        by_task_and_key[(task, key)].append(number(data))
    assert len({task for task, _ in by_task_and_key}) > 1, "the write ran in several tasks"
    for (task, key), numbers in by_task_and_key.items():
        assert numbers == sorted(numbers), f"{key}'s rows of task {task!r} out of order: {numbers[:20]}"


def write_batch(
    spark, rows, options, slices: int = 3, schema: str = "partitionKey string, data string", tagged: bool = True
):
    """Write ``rows`` in ``slices`` tasks; with ``tagged``, each row's data is prefixed with the
    Spark partition (task) that wrote it."""
    from pyspark.sql import functions as F

    df = spark.createDataFrame(spark.sparkContext.parallelize(rows, slices), schema)
    if tagged:
        df = df.withColumn("data", F.concat_ws(":", F.spark_partition_id().cast("string"), "data"))
    df.write.format("kinesis-ddb").options(**options).mode("append").save()


def test_a_batch_write_puts_every_row_once_keeping_each_tasks_key_order(
    spark, kinesis, make_stream, sink_options
):
    stream = make_stream(3)
    rows = numbered_rows(3000, keys=200)
    write_batch(spark, rows, {**sink_options, "streamName": stream})
    records = stream_records(kinesis, stream)
    numbers = sorted(number(r["Data"]) for r in records)
    assert numbers == list(range(3000)), "every row exactly once"
    assert all(r["PartitionKey"] == f"key-{number(r['Data']) % 200}" for r in records)
    assert_each_tasks_rows_in_order([(r["PartitionKey"], r["Data"]) for r in records])


def test_binary_data_and_explicit_hash_keys_route_as_kinesis_does(spark, kinesis, make_stream, sink_options):
    stream = make_stream(2)
    shards = sorted(
        kinesis.list_shards(StreamName=stream)["Shards"], key=lambda s: int(s["HashKeyRange"]["StartingHashKey"])
    )
    low = shards[0]["HashKeyRange"]["StartingHashKey"]
    rows = [(f"k{i}", bytes([i % 256, 0, 255]), low) for i in range(50)]
    write_batch(spark, rows, {**sink_options, "streamName": stream}, slices=2,
                schema="partitionKey string, data binary, explicitHashKey string", tagged=False)
    records = stream_records(kinesis, stream)
    assert sorted(bytes(r["Data"]) for r in records) == sorted(d for _, d, _ in rows)
    assert {r["ShardId"] for r in records} == {shards[0]["ShardId"]}, "the explicit hash key routed every record"


def test_a_streaming_query_writes_another_stream_that_the_source_reads_back_exactly(
    spark, kinesis, make_stream, sink_options, source_options, tmp_path
):
    source, target = make_stream(2), make_stream(3)
    n = 1200
    for first in range(0, n, 400):
        kinesis.put_records(
            StreamName=source,
            Records=[{"PartitionKey": f"key-{i % 20}", "Data": str(i).encode()} for i in range(first, first + 400)],
        )
    reader = spark.readStream.format("kinesis-ddb").options(**{**source_options, "streamName": source})
    query = (
        reader.load()
        .selectExpr("data", "partitionKey")
        .writeStream.format("kinesis-ddb")
        .options(**{**sink_options, "streamName": target})
        .option("checkpointLocation", str(tmp_path / "copy"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(240), "the copying query did not finish"
        assert query.exception() is None
    finally:
        stop_quietly(query)
    back = read_available_now(spark, {**source_options, "streamName": target}, tmp_path / "back")
    rows = back.rows()
    assert sorted(int(r.data) for r in rows) == list(range(n)), "exactly the source's records"
    by_key = written_numbers_by_key([(r.partition_key, r.data) for r in rows])
    # each key's records sit in one source shard, read in order by one task and written in order
    assert all(numbers == sorted(numbers) for numbers in by_key.values())


def test_aggregated_writes_are_read_back_by_aws_kinesis_agg_and_by_the_source(
    spark, kinesis, make_stream, sink_options, source_options, tmp_path
):
    from aws_kinesis_agg.deaggregator import iter_deaggregate_records

    stream = make_stream(2)
    n = 4000
    write_batch(spark, numbered_rows(n, keys=30), {**sink_options, "streamName": stream, "aggregate": "true"})
    records = stream_records(kinesis, stream)
    assert len(records) < n / 50, f"{len(records)} Kinesis records for {n} rows: not aggregated"
    theirs = [
        (u["kinesis"]["partitionKey"], base64.b64decode(u["kinesis"]["data"]))
        for u in iter_deaggregate_records(
            [{k: r[k] for k in ("Data", "PartitionKey", "SequenceNumber", "ApproximateArrivalTimestamp")}
             for r in records],
            data_format="Boto3",
        )
    ]
    assert sorted(number(d) for _, d in theirs) == list(range(n))
    assert_each_tasks_rows_in_order(theirs)
    ours = read_available_now(spark, {**source_options, "streamName": stream}, tmp_path / "read").rows()
    assert sorted(number(r.data) for r in ours) == list(range(n))
    assert all(r.partition_key == f"key-{number(r.data) % 30}" for r in ours)


@pytest.mark.backends("moto")
@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("missing column", "needs column 'partitionKey'"),
        ("wrong type", "column 'partitionKey' is int, it must be string"),
        ("extra column", "also has 'value'"),
        ("missing stream", "was not found: check option 'streamName'"),
        ("overwrite", "can only be appended to"),
        ("unknown option", "'checkpointTable' is not an option for writing"),
    ],
)
def test_bad_input_is_named_and_nothing_is_written(spark, kinesis, make_stream, sink_options, case, says):
    stream = make_stream(1)
    options = {**sink_options, "streamName": stream}
    df = spark.createDataFrame([("k", "v")], "partitionKey string, data string")
    mode = "append"
    if case == "missing column":
        df = df.drop("partitionKey")
    elif case == "wrong type":
        df = spark.createDataFrame([(1, "v")], "partitionKey int, data string")
    elif case == "extra column":
        df = df.selectExpr("*", "'x' AS value")
    elif case == "missing stream":
        options["streamName"] = "no-such-stream"
    elif case == "overwrite":
        mode = "overwrite"
    elif case == "unknown option":
        options["checkpointTable"] = "t"
    with pytest.raises(Exception) as err:
        df.write.format("kinesis-ddb").options(**options).mode(mode).save()
    assert says in str(err.value)
    assert stream_records(kinesis, stream) == []


@pytest.mark.backends("moto")
def test_a_null_partition_key_fails_the_task_naming_the_row_and_column(spark, make_stream, sink_options):
    stream = make_stream(1)
    df = spark.createDataFrame([("k", "a"), (None, "b")], "partitionKey string, data string").coalesce(1)
    with pytest.raises(Exception) as err:
        df.write.format("kinesis-ddb").options(**sink_options, streamName=stream).mode("append").save()
    assert "Row 1 of this task cannot be written to Kinesis stream" in str(err.value)
    assert "column 'partitionKey' is null" in str(err.value)


class _SplitsWhatItLandedOn:
    """A boto3 Kinesis client whose first ``PutRecords`` answer is followed by a split of every
    shard it landed on, before the caller sees it: the caller's next listing finds those shards
    closed (a second split soon after the first, as an on-demand stream rescaling does)."""

    def __init__(self, client, kinesis, stream: str) -> None:
        self._client, self._kinesis, self._stream = client, kinesis, stream
        self.split: list[str] = []

    def put_records(self, **kwargs):
        resp = self._client.put_records(**kwargs)
        if not self.split:
            from tests.integration.test_resharding import split_in_two

            self.split = sorted({r["ShardId"] for r in resp["Records"] if "ShardId" in r})
            for shard_id in self.split:
                split_in_two(self._kinesis, self._stream, shard_id)
        return resp

    def __getattr__(self, name):
        return getattr(self._client, name)


@pytest.mark.backends("kinesis-local")  # moto keeps writing a split parent
@pytest.mark.parametrize("landed_closes", [False, True], ids=["landed-shard-open", "landed-shard-closed"])
def test_aggregates_built_before_a_reshard_send_again_the_rows_their_new_shard_does_not_hold(
    kinesis, kinesis_backend, make_stream, landed_closes
):
    from kinesis_source import kpl
    from kinesis_source.aws.clients import AwsSettings
    from kinesis_source.sink.options import SinkOptions
    from kinesis_source.sink.putter import Putter
    from kinesis_source.sink.rows import Columns, user_record
    from kinesis_source.sink.shards import ShardMap
    from tests.integration.test_resharding import split_in_two

    stream = make_stream(2)
    with QuotaProxy(kinesis_backend) as quota:  # the write keeps to the quotas through both reshards
        opts = SinkOptions.parse({**options_for(quota.url), "streamName": stream, "aggregate": "true"})
        client = AwsSettings.for_kinesis(opts).boto3_client("kinesis")
        stale = ShardMap.load(client, stream)
        for shard_id in stale.ids:
            split_in_two(kinesis, stream, shard_id)
        if landed_closes:
            client = _SplitsWhatItLandedOn(client, kinesis, stream)
        columns = Columns("data", True, "partitionKey", None)
        rows = [user_record(i, f"key-{i % 60}", str(i), None, columns, stream) for i in range(1200)]
        report = Putter(client, opts, stale).write(rows)
        assert quota.refused_records(stream) == []
    assert report.shard_map_refreshes >= 1 and report.rerouted_rows > 0
    ranges = {
        s["ShardId"]: (int(s["HashKeyRange"]["StartingHashKey"]), int(s["HashKeyRange"]["EndingHashKey"]))
        for s in kinesis.list_shards(StreamName=stream)["Shards"]
    }
    records = stream_records(kinesis, stream)
    if landed_closes:
        assert client.split and {r["ShardId"] for r in records} & set(client.split)
        assert all(ranges[s] for s in client.split)
    kept = []  # what KCL keeps: the user records within the range of the shard they landed on
    for record in records:
        lo, hi = ranges[record["ShardId"]]
        for key, data, hash_key in kpl.decode(record["Data"]):
            if lo <= kpl.effective_hash_key(key, hash_key) <= hi:
                kept.append(int(data))
    assert sorted(kept) == list(range(1200)), "each row kept exactly once where it landed"


def test_partial_failures_lose_nothing_and_keep_each_tasks_key_order(
    spark, kinesis, make_stream, sink_proxy, sink_options
):
    stream = make_stream(3)
    sink_proxy.fail_records(0.3)
    rows = numbered_rows(3000, keys=200)
    write_batch(spark, rows, {**sink_options, "streamName": stream})
    assert sink_proxy.failed_records("InternalFailure") > 600
    records = stream_records(kinesis, stream)
    assert sorted(number(r["Data"]) for r in records) == list(range(3000)), "every row exactly once"
    assert_each_tasks_rows_in_order([(r["PartitionKey"], r["Data"]) for r in records])


@pytest.mark.backends("moto")
def test_partial_failures_without_key_order_still_lose_nothing(spark, kinesis, make_stream, sink_proxy, sink_options):
    stream = make_stream(2)
    sink_proxy.fail_records(0.3)
    write_batch(spark, numbered_rows(2000, keys=3), {**sink_options, "streamName": stream, "preserveKeyOrder": "false"})
    assert sorted(number(r["Data"]) for r in stream_records(kinesis, stream)) == list(range(2000))


@pytest.mark.backends("moto")
def test_records_refused_past_their_retries_fail_the_write_naming_stream_count_and_code(
    spark, make_stream, sink_proxy, sink_options
):
    stream = make_stream(1)
    sink_proxy.fail_records(1.0)
    df = spark.createDataFrame(numbered_rows(5, keys=5), "partitionKey string, data string").coalesce(1)
    with pytest.raises(Exception) as err:
        df.write.format("kinesis-ddb").options(**sink_options, streamName=stream, maxRecordRetries="1").mode(
            "append"
        ).save()
    text = str(err.value)
    assert f"could not be written to Kinesis stream '{stream}'" in text
    assert "refused each of them 2 times" in text and "InternalFailure x" in text
    # every record's first attempt, then retries until the first record ran out of them
    assert 6 <= sink_proxy.failed_records() <= 10


def test_one_task_writes_within_the_shards_write_quotas_and_is_never_refused(
    spark, kinesis_backend, kinesis, make_stream
):
    stream = make_stream(2)
    with QuotaProxy(kinesis_backend) as quota:
        rows = [(f"key-{i % 50}", f"{i}".ljust(1000, ".")) for i in range(3000)]
        df = spark.createDataFrame(rows, "partitionKey string, data string").coalesce(1)
        df.write.format("kinesis-ddb").options(**options_for(quota.url), streamName=stream).mode("append").save()
        assert quota.refused_records(stream) == [], "the sink paced itself to the quotas"
        assert len(quota.written(stream)) == 3000
    assert sorted(number(r["Data"]) for r in stream_records(kinesis, stream)) == list(range(3000))


def test_writes_beside_another_writer_of_the_same_shards_are_refused_retried_and_all_land(
    spark, kinesis_backend, kinesis, make_stream
):
    import threading

    import boto3

    stream = make_stream(1)
    # a quota of 300 records/s, so that any machine's moto outruns it with both writers
    with QuotaProxy(kinesis_backend, Quotas(put_records_per_shard=300)) as quota:
        neighbour = boto3.client("kinesis", **{
            "endpoint_url": quota.url, "region_name": "us-east-1",
            "aws_access_key_id": "neighbour", "aws_secret_access_key": "x"})
        stop = threading.Event()

        def write_beside() -> None:  # another application: 25 records every 0.1 s, 83% of the quota
            while not stop.wait(0.1):
                neighbour.put_records(
                    StreamName=stream, Records=[{"PartitionKey": "other", "Data": b"n"} for _ in range(25)]
                )

        thread = threading.Thread(target=write_beside, daemon=True)
        thread.start()
        try:
            options = {**options_for(quota.url), "streamName": stream}
            write_batch(spark, numbered_rows(600, keys=100), options, slices=2)
        finally:
            stop.set()
            thread.join(10)
        assert quota.refused_records(stream), "the shard's quota was spent by both writers"
    records = [r for r in stream_records(kinesis, stream) if r["PartitionKey"] != "other"]
    assert sorted(number(r["Data"]) for r in records) == list(range(600))
    assert_each_tasks_rows_in_order([(r["PartitionKey"], r["Data"]) for r in records])


@pytest.mark.backends("moto")
def test_a_micro_batch_replayed_after_its_write_failed_loses_nothing_and_repeats_only_its_own_rows(
    spark, kinesis, make_stream, sink_proxy, sink_options, source_options, tmp_path
):
    source, target = make_stream(2), make_stream(2)
    kinesis.put_records(
        StreamName=source, Records=[{"PartitionKey": f"key-{i % 20}", "Data": str(i).encode()} for i in range(400)]
    )

    def copy() -> Any:
        return (
            spark.readStream.format("kinesis-ddb").options(**{**source_options, "streamName": source}).load()
            .selectExpr("data", "partitionKey")
            .writeStream.format("kinesis-ddb")
            .options(**{**sink_options, "streamName": target, "maxRetries": "1", "retryBaseDelayMs": "20"})
            .option("checkpointLocation", str(tmp_path / "copy"))
            .trigger(availableNow=True)
            .start()
        )

    sink_proxy.fail({"PutRecords"}, 0.5)  # whole calls fail: a task gives up after its retry
    failed = copy()
    try:
        wait_for(lambda: not failed.isActive, timeout=180, what="the copy to fail")
        assert failed.exception() is not None, "the write failed"
    finally:
        stop_quietly(failed)
    sink_proxy.clear()
    again = copy()  # Spark replays the batch whose offsets it logged: its rows are written again
    try:
        assert again.awaitTermination(180) and again.exception() is None
    finally:
        stop_quietly(again)
    written = Counter(number(r["Data"]) for r in stream_records(kinesis, target))
    assert set(written) == set(range(400)), "every row of the source"
    assert max(written.values()) <= 2, "a row is written again only by the replay of its batch"


@pytest.mark.backends("moto")
def test_write_callbacks_hear_each_write_and_micro_batch_and_one_that_raises_fails_the_write(
    spark, kinesis, make_stream, sink_options, source_options, tmp_path
):
    import json
    import os
    from pathlib import Path

    stream = make_stream(2)
    heard = Path(os.environ["KDDB_TEST_CALLBACK_DIR"]) / f"{stream}.writes.jsonl"
    options = {**sink_options, "streamName": stream, "onWrite": "tests.support.callbacks:record_write"}
    write_batch(spark, numbered_rows(300, keys=30), options)
    first = json.loads(heard.read_text().splitlines()[0])
    assert first["batch_id"] is None and first["rows"] == first["records"] == 300
    assert first["tasks"] == 3 and first["requests"] >= 3 and first["refused"] == {}

    source = make_stream(1)
    kinesis.put_records(StreamName=source, Records=[{"PartitionKey": "k", "Data": b"x"} for _ in range(50)])
    query = (
        spark.readStream.format("kinesis-ddb").options(**{**source_options, "streamName": source}).load()
        .selectExpr("data", "partitionKey").writeStream.format("kinesis-ddb").options(**options)
        .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start()
    )
    try:
        assert query.awaitTermination(180) and query.exception() is None
    finally:
        stop_quietly(query)
    batches = [json.loads(line) for line in heard.read_text().splitlines()[1:]]
    assert [b["batch_id"] for b in batches] == list(range(len(batches))) and sum(b["rows"] for b in batches) == 50

    with pytest.raises(Exception) as err:
        write_batch(spark, numbered_rows(10, keys=2), {**options, "onWrite": "tests.support.callbacks:refuse_write"})
    assert "Write callback refuse_write raised ValueError: callback refuses the write of 10 rows" in str(err.value)
    assert f"rows were written to Kinesis stream '{stream}'" in str(err.value)


@pytest.mark.backends("moto")
def test_a_write_callback_given_to_register_hears_the_write(spark, make_stream, sink_options, tmp_path):
    import json

    from kinesis_source import register

    stream = make_stream(1)
    heard = tmp_path / "heard.jsonl"

    def on_write(info):  # runs in Spark's driver-side Python process, pickled with the class
        with open(heard, "a") as fh:
            fh.write(json.dumps({"stream": info.stream, "rows": info.rows}) + "\n")

    register(spark, on_write=on_write)
    try:
        write_batch(spark, numbered_rows(40, keys=4), {**sink_options, "streamName": stream}, slices=2)
    finally:
        register(spark)
    assert [json.loads(line) for line in heard.read_text().splitlines()] == [{"stream": stream, "rows": 40}]
