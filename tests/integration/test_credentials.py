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


def test_a_credentials_provider_signs_every_call_of_driver_and_executors(
    spark, endpoint, kinesis, make_stream, source_options, tmp_path
):
    from tests.support.credentials import ACCESS_KEY, calls

    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    producer.put(60)
    options = {k: v for k, v in source_options.items() if k not in ("awsAccessKeyId", "awsSecretKey")}
    with FaultProxy(endpoint.url) as proxy:
        options = {**options, "streamName": stream, "endpointUrl": proxy.url, "dynamodbEndpointUrl": proxy.url,
                   "credentialsProvider": "tests.support.credentials:lasting"}
        sink = Collector()
        query = start_query(spark, options, tmp_path / "ck", sink)
        try:
            wait_for(lambda: sink.count() >= 60, timeout=90, what="60 rows")
        finally:
            stop_quietly(query)
        seen = proxy.operations()
    service_calls = [s for s in seen if s.operation in KINESIS_OPS | DYNAMODB_OPS]
    assert {s.access_key for s in service_calls} == {ACCESS_KEY}
    # the driver's async client and the executors' sync client alike
    assert {s.client for s in service_calls if s.operation == "GetRecords"} >= {"sync"}
    assert {s.operation for s in service_calls} >= {"GetRecords", "ListShards", "TransactWriteItems"}
    # called in the driver's helper and in an executor's worker: two processes at least
    assert len({c["pid"] for c in calls("lasting")}) >= 2


def test_short_lived_provided_credentials_are_fetched_again_lasting_ones_once(endpoint):
    from kinesis_source.aws.clients import AwsSettings
    from tests.support.credentials import calls

    for name in ("short_lived", "lasting"):
        before = len(calls(name))
        client = AwsSettings(region="us-east-1", endpoint_url=endpoint.url,
                             credentials_provider=f"tests.support.credentials:{name}").boto3_client("kinesis")
        client.list_streams()
        client.list_streams()
        fetched = len(calls(name)) - before
        if name == "short_lived":
            # expiring within botocore's mandatory refresh window: fetched again for each request
            assert fetched >= 2, fetched
        else:
            assert fetched == 1, fetched


def test_a_provider_that_returns_the_wrong_thing_is_named(endpoint):
    from kinesis_source.aws.clients import AwsSettings
    from kinesis_source.errors import OptionError

    client = AwsSettings(region="us-east-1", endpoint_url=endpoint.url,
                         credentials_provider="tests.support.credentials:broken").boto3_client("kinesis")
    with pytest.raises(OptionError, match="'credentialsProvider' = 'tests.support.credentials:broken' must "
                                          "return a mapping with 'access_key' and 'secret_key'.*\\['key'\\]"):
        client.list_streams()
