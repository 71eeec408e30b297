"""One end-to-end read in a fresh process, for the oldest supported pyspark (4.0: no
``latestOffset(start, limit)``, no read-limit classes). Prints one JSON line of results."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
for key, value in {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local",
                   "AWS_DEFAULT_REGION": "us-east-1"}.items():
    os.environ.setdefault(key, value)

import boto3  # noqa: E402
import pyspark  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

from kinesis_source import register  # noqa: E402
from kinesis_source.local import LocalEndpoint  # noqa: E402


def main() -> None:
    with LocalEndpoint() as ep:
        kinesis = boto3.client("kinesis", endpoint_url=ep.url)
        kinesis.create_stream(StreamName="smoke", ShardCount=2)
        kinesis.get_waiter("stream_exists").wait(StreamName="smoke", WaiterConfig={"Delay": 1})
        sent = []

        def put(prefix, n):
            resp = kinesis.put_records(StreamName="smoke", Records=[
                {"Data": f"{prefix}-{i}".encode(), "PartitionKey": str(i)} for i in range(n)])
            sent.extend((r["ShardId"], r["SequenceNumber"]) for r in resp["Records"])

        put("a", 100)
        spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        got = []
        query = (
            spark.readStream.format("kinesis-ddb").option("streamName", "smoke")
            .option("applicationName", "smoke").option("endpointUrl", ep.url)
            .option("dynamodbEndpointUrl", ep.url).option("minProbeIntervalMs", "100").load()
            .writeStream.foreachBatch(
                lambda df, _: got.extend((r.shardId, r.sequenceNumber) for r in df.collect()))
            .option("checkpointLocation", tempfile.mkdtemp())
            .trigger(processingTime="200 milliseconds").start()
        )
        deadline = time.monotonic() + 120
        for target, more in ((100, 50), (150, 0)):
            while len(got) < target and query.isActive and time.monotonic() < deadline:
                time.sleep(0.2)  # polling the sink with a deadline
            if more:
                put("b", more)
        error = query.exception()
        query.stop()
        spark.stop()
    print(json.dumps({"pyspark": pyspark.__version__, "sent": sorted(sent), "got": got,
                      "error": str(error) if error else None}))


if __name__ == "__main__":
    main()
