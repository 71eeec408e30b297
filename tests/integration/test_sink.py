"""The sink, written to through real Spark (``local[2]``) on moto and kinesis-local, and read
back by plain boto3 calls, aws-kinesis-agg and this project's source."""

from __future__ import annotations

import base64
from collections import defaultdict

import pytest

from tests.support.spark_query import read_available_now, stop_quietly

pytestmark = pytest.mark.spark


@pytest.fixture
def sink_options(kinesis_backend):
    """What a write needs to reach the backend under test."""
    return {
        "endpointUrl": kinesis_backend,
        "region": "us-east-1",
        "awsAccessKeyId": "local",
        "awsSecretKey": "local",
    }


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


def written_numbers_by_key(records: list[tuple[str, bytes]]) -> dict[str, list[int]]:
    """Each key's row numbers in the order the stream holds them."""
    out: dict[str, list[int]] = defaultdict(list)
    for key, data in records:
        out[key].append(int(data))
    return out


def assert_each_tasks_rows_in_order(by_key: dict[str, list[int]], slices: list[range]) -> None:
    """Within each task's rows (a slice of the input), every key's rows are in row order."""
    for key, numbers in by_key.items():
        for rows in slices:
            mine = [i for i in numbers if i in rows]
            assert mine == sorted(mine), f"{key}'s rows of task {rows} out of order: {mine[:20]}"


def write_batch(spark, rows, options, slices: int = 3, schema="partitionKey string, data string"):
    df = spark.createDataFrame(spark.sparkContext.parallelize(rows, slices), schema)
    df.write.format("kinesis-ddb").options(**options).mode("append").save()


def slice_ranges(n: int, slices: int) -> list[range]:
    """The rows each of ``parallelize``'s slices holds (contiguous, as it cuts a list)."""
    return [range(i * n // slices, (i + 1) * n // slices) for i in range(slices)]


def test_a_batch_write_puts_every_row_once_keeping_each_tasks_key_order(
    spark, kinesis, make_stream, sink_options
):
    stream = make_stream(3)
    rows = numbered_rows(3000, keys=40)
    write_batch(spark, rows, {**sink_options, "streamName": stream})
    records = stream_records(kinesis, stream)
    numbers = sorted(int(r["Data"]) for r in records)
    assert numbers == list(range(3000)), "every row exactly once"
    assert all(r["PartitionKey"] == f"key-{int(r['Data']) % 40}" for r in records)
    by_key = written_numbers_by_key([(r["PartitionKey"], r["Data"]) for r in records])
    assert_each_tasks_rows_in_order(by_key, slice_ranges(3000, 3))


def test_binary_data_and_explicit_hash_keys_route_as_kinesis_does(spark, kinesis, make_stream, sink_options):
    stream = make_stream(2)
    shards = sorted(
        kinesis.list_shards(StreamName=stream)["Shards"], key=lambda s: int(s["HashKeyRange"]["StartingHashKey"])
    )
    low = shards[0]["HashKeyRange"]["StartingHashKey"]
    rows = [(f"k{i}", bytes([i % 256, 0, 255]), low) for i in range(50)]
    write_batch(spark, rows, {**sink_options, "streamName": stream}, slices=2,
                schema="partitionKey string, data binary, explicitHashKey string")
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
    assert sorted(int(d) for _, d in theirs) == list(range(n))
    assert_each_tasks_rows_in_order(written_numbers_by_key(theirs), slice_ranges(n, 3))
    ours = read_available_now(spark, {**source_options, "streamName": stream}, tmp_path / "read").rows()
    assert sorted(int(r.data) for r in ours) == list(range(n))
    assert all(r.partition_key == f"key-{int(r.data) % 30}" for r in ours)


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


@pytest.mark.backends("kinesis-local")  # moto keeps writing a split parent
def test_aggregates_built_before_a_reshard_send_again_the_rows_their_new_shard_does_not_hold(
    kinesis, kinesis_backend, make_stream, sink_options
):
    from kinesis_source import kpl
    from kinesis_source.aws.clients import AwsSettings
    from kinesis_source.sink.options import SinkOptions
    from kinesis_source.sink.putter import Putter
    from kinesis_source.sink.rows import Columns, user_record
    from kinesis_source.sink.shards import ShardMap
    from tests.integration.test_resharding import split_in_two

    stream = make_stream(2)
    opts = SinkOptions.parse({**sink_options, "streamName": stream, "aggregate": "true"})
    client = AwsSettings.for_kinesis(opts).boto3_client("kinesis")
    stale = ShardMap.load(client, stream)
    for shard_id in stale.ids:
        split_in_two(kinesis, stream, shard_id)
    columns = Columns("data", True, "partitionKey", None)
    rows = [user_record(i, f"key-{i % 60}", str(i), None, columns, stream) for i in range(1200)]
    report = Putter(client, opts, stale).write(rows)
    assert report.shard_map_refreshes >= 1 and report.rerouted_rows > 0
    ranges = {
        s["ShardId"]: (int(s["HashKeyRange"]["StartingHashKey"]), int(s["HashKeyRange"]["EndingHashKey"]))
        for s in kinesis.list_shards(StreamName=stream)["Shards"]
    }
    kept = []  # what KCL keeps: the user records within the range of the shard they landed on
    for record in stream_records(kinesis, stream):
        lo, hi = ranges[record["ShardId"]]
        for key, data, hash_key in kpl.decode(record["Data"]):
            if lo <= kpl.effective_hash_key(key, hash_key) <= hi:
                kept.append(int(data))
    assert sorted(kept) == list(range(1200)), "each row kept exactly once where it landed"
