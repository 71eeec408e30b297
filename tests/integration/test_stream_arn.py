"""Streams given by ARN (``streamARN``): the query reads them, keyed by their names, and every
call the source makes that names a stream names it by ARN (as a stream shared from another
account needs: its name means nothing in the reader's account)."""

from __future__ import annotations

import json
import threading

import pytest

from tests.support.cli import cli
from tests.support.producer import Producer
from tests.support.proxy import FaultProxy, Seen
from tests.support.spark_query import read_available_now

pytestmark = pytest.mark.spark


class Addressing(FaultProxy):
    """Records, per request, the operation and how it named its stream."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.named: list[tuple[str | None, str, dict[str, str]]] = []
        self._named_lock = threading.Lock()

    def _describe(self, call: Seen, body: bytes) -> Seen:
        try:
            req = json.loads(body) if body.startswith(b"{") else {}
        except ValueError:
            req = {}
        keys = {k: req[k] for k in ("StreamName", "StreamARN") if k in req}
        with self._named_lock:
            self.named.append((call.access_key, call.operation, keys))
        return call


def test_a_stream_given_by_arn_is_read_and_named_by_arn_in_every_call(
    spark, kinesis, kinesis_backend, make_stream, source_options, tmp_path
):
    stream = make_stream(2)
    arn = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
    producer = Producer(kinesis, stream)
    producer.put(300, burst=100)
    options = {k: v for k, v in source_options.items() if k != "region"}
    options.update(streamARN=arn, initialPosition="TRIM_HORIZON")
    with Addressing(kinesis_backend) as proxy:
        options["endpointUrl"] = proxy.url
        sink = read_available_now(spark, options, tmp_path / "ck")
        # the status command, told the stream's ARN, names it the same way
        before = len(proxy.named)
        status = json.loads(cli(
            "status", "--app", options["applicationName"], "--endpoint-url", options["dynamodbEndpointUrl"],
            "--kinesis-endpoint-url", proxy.url, "--region", "us-east-1", "--stream-arn", arn, "--json",
        ).stdout)
        by_status = proxy.named[before:]
    assert {s["stream"] for s in status} == {stream} and all(s["behind_records"] == 0 for s in status)
    assert by_status and all("StreamName" not in keys for _, _, keys in by_status), by_status
    bad = cli("status", "--app", "x", "--stream-arn", "orders", check=False)
    assert bad.returncode != 0 and "--stream-arn" in bad.stderr and "not a Kinesis stream ARN" in bad.stderr
    rows = sink.rows()
    assert sorted((r.shard_id, r.seq) for r in rows) == sorted((p.shard_id, p.seq) for p in producer.sent)
    assert {r.stream for r in rows} == {stream}  # the name keys the rows (and offsets)
    ours = [(op, keys) for key, op, keys in proxy.named if key == "local"]
    by_name = [(op, keys) for op, keys in ours if "StreamName" in keys]
    assert by_name == [], f"calls that named the stream by name: {by_name[:5]}"
    named = {op for op, keys in ours if keys.get("StreamARN") == arn}
    assert {"ListShards", "GetShardIterator", "GetRecords", "DescribeStreamSummary"} <= named, named
    records_calls = [keys for op, keys in ours if op == "GetRecords"]
    assert records_calls and all(keys.get("StreamARN") == arn for keys in records_calls)


def test_a_stream_written_by_arn_is_named_by_arn_in_every_call(spark, kinesis, kinesis_backend, make_stream):
    stream = make_stream(2)
    arn = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
    with Addressing(kinesis_backend) as proxy:
        df = spark.createDataFrame([(f"k{i % 9}", f"v{i}") for i in range(200)], "partitionKey string, data string")
        df.write.format("kinesis-ddb").options(
            streamARN=arn, endpointUrl=proxy.url, awsAccessKeyId="local", awsSecretKey="local"
        ).mode("append").save()
    ours = [(op, keys) for key, op, keys in proxy.named if key == "local"]
    assert {op for op, keys in ours if keys.get("StreamARN") == arn} == {"ListShards", "PutRecords"}
    assert all("StreamName" not in keys for _, keys in ours), ours
    written = []
    for shard in kinesis.list_shards(StreamName=stream)["Shards"]:
        iterator = kinesis.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        written += [r["Data"] for r in kinesis.get_records(ShardIterator=iterator)["Records"]]
    assert sorted(written) == sorted(f"v{i}".encode() for i in range(200))
