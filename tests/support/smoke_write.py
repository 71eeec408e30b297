"""Writes through the sink in a fresh process, for the oldest supported pyspark (4.0: no Arrow
stream writer, so streaming writes go through the Row writer): a batch write and a streaming
copy of one stream into another. Prints one JSON line of results."""

from __future__ import annotations

import json
import os
import sys
import tempfile

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
for key, value in {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local",
                   "AWS_DEFAULT_REGION": "us-east-1"}.items():
    os.environ.setdefault(key, value)

import boto3  # noqa: E402
import pyspark  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

from kinesis_source import register  # noqa: E402
from kinesis_source.tools.local import LocalEndpoint  # noqa: E402


def stream_data(kinesis, stream: str) -> list[str]:
    """Every record's data in ``stream``, shard by shard."""
    out = []
    for shard in kinesis.list_shards(StreamName=stream)["Shards"]:
        iterator = kinesis.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while iterator:
            page = kinesis.get_records(ShardIterator=iterator)
            out += [r["Data"].decode() for r in page["Records"]]
            iterator = page.get("NextShardIterator") if page["Records"] else None
    return out


def main() -> None:
    with LocalEndpoint() as ep:
        kinesis = boto3.client("kinesis", endpoint_url=ep.url)
        for name in ("batch", "source", "copy"):
            kinesis.create_stream(StreamName=name, ShardCount=2)
            kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 1})
        kinesis.put_records(StreamName="source", Records=[
            {"Data": f"s-{i}".encode(), "PartitionKey": str(i % 7)} for i in range(120)])
        spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        sink = {"endpointUrl": ep.url, "region": "us-east-1"}
        df = spark.createDataFrame([(str(i % 5), f"b-{i}") for i in range(90)], "partitionKey string, data string")
        df.write.format("kinesis-ddb").options(**sink, streamName="batch").mode("append").save()
        with tempfile.TemporaryDirectory() as ck:
            query = (
                spark.readStream.format("kinesis-ddb").option("streamName", "source")
                .option("applicationName", "smoke-write").option("endpointUrl", ep.url)
                .option("dynamodbEndpointUrl", ep.url).option("minProbeIntervalMs", "100").load()
                .selectExpr("data", "partitionKey")
                .writeStream.format("kinesis-ddb").options(**sink, streamName="copy")
                .option("checkpointLocation", ck).trigger(once=True).start()
            )
            query.awaitTermination(240)
            error = str(query.exception()) if query.exception() else None
        print(json.dumps({
            "pyspark": pyspark.__version__,
            "error": error,
            "batch": sorted(stream_data(kinesis, "batch")),
            "copy": sorted(stream_data(kinesis, "copy")),
        }))
        spark.stop()


if __name__ == "__main__":
    main()
