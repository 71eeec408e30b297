"""The application the install-route tests hand to ``spark-submit``: it starts the local
endpoint, writes 50 records to a 2-shard stream, reads them with ``format("kinesis-ddb")`` and
prints ``ROWS <n>``. It imports kinesis_source however the route under test provides it."""

import tempfile

import boto3
from pyspark.sql import SparkSession

from kinesis_source import register
from kinesis_source.tools.local import LocalEndpoint

with LocalEndpoint() as endpoint:
    aws = dict(endpoint_url=endpoint.url, region_name="us-east-1",
               aws_access_key_id="local", aws_secret_access_key="local")
    kinesis = boto3.client("kinesis", **aws)
    kinesis.create_stream(StreamName="orders", ShardCount=2)
    kinesis.get_waiter("stream_exists").wait(StreamName="orders", WaiterConfig={"Delay": 1})
    kinesis.put_records(StreamName="orders", Records=[
        {"Data": f"order-{i}".encode(), "PartitionKey": str(i)} for i in range(50)])
    spark = SparkSession.builder.getOrCreate()
    register(spark)
    reader = spark.readStream.format("kinesis-ddb")
    for key, value in {"streamName": "orders", "applicationName": "submit-app", "region": "us-east-1",
                       "endpointUrl": endpoint.url, "dynamodbEndpointUrl": endpoint.url,
                       "awsAccessKeyId": "local", "awsSecretKey": "local"}.items():
        reader = reader.option(key, value)
    query = (reader.load().writeStream.format("memory").queryName("orders")
             .option("checkpointLocation", tempfile.mkdtemp()).start())
    query.processAllAvailable()
    print("ROWS", spark.sql("SELECT count(*) FROM orders").first()[0])
    query.stop()
    spark.stop()
