"""The application the install-route tests run (with ``spark-submit`` or plain Python): it
writes 50 records to a new 2-shard stream, reads them with ``format("kinesis-ddb")`` and prints
``ROWS <n>``. It imports kinesis_source however the route under test provides it.

- ``--auto``: no ``register(spark)``: the format must come from PySpark's automatic
  registration (and kinesis_source is not imported here at all);
- ``--connect``: a Spark Connect session (``remote("local[2]")``) instead of a classic one;
- ``--endpoint URL``: a running local endpoint, instead of starting one (which needs the
  package's ``LocalEndpoint``);
- ``--where``: then print ``WHERE <executor's SPARK_LOCAL_IP> <path>`` for where each executor's
  Python found ``kinesis_source`` (on a cluster: which route brought it).
"""

import argparse
import contextlib
import tempfile
import uuid

import boto3
from pyspark.sql import SparkSession


def endpoint_url(given: str | None, stack: contextlib.ExitStack) -> str:
    if given:
        return given
    from kinesis_source.tools.local import LocalEndpoint

    return stack.enter_context(LocalEndpoint()).url


def origin(_):
    """Where this Python finds the package, and the host it runs on."""
    import importlib.util
    import os

    spec = importlib.util.find_spec("kinesis_source")
    return os.environ.get("SPARK_LOCAL_IP"), spec.origin if spec else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--auto", action="store_true")
    parser.add_argument("--connect", action="store_true")
    parser.add_argument("--endpoint")
    parser.add_argument("--where", action="store_true")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        url = endpoint_url(args.endpoint, stack)
        aws = dict(endpoint_url=url, region_name="us-east-1",
                   aws_access_key_id="local", aws_secret_access_key="local")
        stream = f"orders-{uuid.uuid4().hex[:8]}"
        kinesis = boto3.client("kinesis", **aws)
        kinesis.create_stream(StreamName=stream, ShardCount=2)
        kinesis.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 1})
        kinesis.put_records(StreamName=stream, Records=[
            {"Data": f"order-{i}".encode(), "PartitionKey": str(i)} for i in range(50)])
        builder = SparkSession.builder
        spark = (builder.remote("local[2]") if args.connect else builder).getOrCreate()
        if not args.auto:
            from kinesis_source import register

            register(spark)
        reader = spark.readStream.format("kinesis-ddb")
        for key, value in {"streamName": stream, "applicationName": f"app-{stream}",
                           "region": "us-east-1", "endpointUrl": url, "dynamodbEndpointUrl": url,
                           "awsAccessKeyId": "local", "awsSecretKey": "local"}.items():
            reader = reader.option(key, value)
        query = (reader.load().writeStream.format("memory").queryName("orders")
                 .option("checkpointLocation", tempfile.mkdtemp()).start())
        query.processAllAvailable()
        print("ROWS", spark.sql("SELECT count(*) FROM orders").first()[0])
        if args.where:
            for host, path in sorted(set(spark.sparkContext.parallelize(range(32), 32).map(origin).collect())):
                print("WHERE", host, path)
        query.stop()
        spark.stop()


if __name__ == "__main__":
    main()
