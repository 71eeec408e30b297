"""One credentials setting serves Kinesis and DynamoDB alike, on the driver and the executors."""

from __future__ import annotations

import pytest

from tests.support.producer import Producer
from tests.support.proxy import FaultProxy
from tests.support.spark_query import Collector, start_query, stop_quietly
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.backends("moto")]

KINESIS_OPS = {"ListShards", "GetShardIterator", "GetRecords", "DescribeStreamSummary"}
DYNAMODB_OPS = {"DescribeTable", "UpdateItem", "Query", "TransactWriteItems", "GetItem"}


def test_assumed_role_signs_every_kinesis_and_dynamodb_call(
    spark, endpoint, kinesis, make_stream, source_options, tmp_path
):
    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    producer.put(60)
    with FaultProxy(endpoint.url) as proxy:
        options = {
            **source_options,
            "streamName": stream,
            "endpointUrl": proxy.url,
            "dynamodbEndpointUrl": proxy.url,
            "stsEndpointUrl": proxy.url,
            "roleArn": "arn:aws:iam::123456789012:role/kinesis-reader",
            "roleSessionName": "kddb-test",
        }
        sink = Collector()
        query = start_query(spark, options, tmp_path / "ck", sink)
        try:
            wait_for(lambda: sink.count() >= 60, timeout=90, what="60 rows")
            producer.put(40)
            wait_for(lambda: sink.count() >= 100, timeout=90, what="100 rows")
        finally:
            stop_quietly(query)
        seen = proxy.operations()
    ops = {s.operation for s in seen}
    assert {"GetRecords", "ListShards", "TransactWriteItems"} <= ops, ops
    # AssumeRole is signed with the source keys; everything else with the role's keys.
    assumed = [s for s in seen if s.operation == "POST"]
    assert assumed and {s.access_key for s in assumed} == {"local"}
    service_calls = [s for s in seen if s.operation in KINESIS_OPS | DYNAMODB_OPS]
    keys = {s.access_key for s in service_calls}
    assert "local" not in keys, "a service call used the source keys, not the role"
    assert all(k and k.startswith("ASIA") for k in keys), keys
    # the executors' GetRecords and the driver's DynamoDB commits both used the role
    assert {s.operation for s in service_calls} >= {"GetRecords", "TransactWriteItems"}
