"""Scenarios 4 and 5: DynamoDB or Kinesis unavailable (the proxy answers 5xx, then drops
connections) for KDDB_CHAOS_OUTAGE_S seconds (10 s bounded, 30 s long form): the query waits and
resumes with every record once; with few retries it fails clearly; stored positions never
regress, and a restart after the failure loses nothing."""

from __future__ import annotations

import time

import pytest

from kinesis_source.checkpoints.format import order_key
from tests.chaos import harness
from tests.support.checker import Delivery, check
from tests.support.committed import TABLE, stored, wait_committed
from tests.support.producer import Producer
from tests.support.proxy import DROPPED, FaultProxy
from tests.support.regression import RegressionWatch
from tests.support.spark_query import running
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.backends(*harness.backends("moto"))]

OPS = {
    "dynamodb": {"DescribeTable", "CreateTable", "UpdateItem", "Query", "TransactWriteItems", "GetItem", "PutItem"},
    "kinesis": {
        "ListShards", "GetShardIterator", "GetRecords", "DescribeStreamSummary", "DescribeStream", "ListStreams"
    },
}
ENDPOINT_OPTION = {"dynamodb": "dynamodbEndpointUrl", "kinesis": "endpointUrl"}


def keys(rows):
    return [(r.shard_id, r.seq) for r in rows]


@pytest.mark.parametrize("service", ["dynamodb", "kinesis"])
def test_outage_within_retries_waits_and_resumes(
    service, spark, kinesis, kinesis_backend, ddb, endpoint, make_stream, source_options, tmp_path
):
    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    producer.put(200)
    # the proxy stands in front of the service that goes down (Kinesis: the backend under test)
    with FaultProxy(kinesis_backend if service == "kinesis" else endpoint.url) as proxy:
        # 60 attempts of botocore's standard mode (5xx backoff: random up to 0.01 s * 2^n,
        # capped at 20 s) outlast a 30 s outage by far.
        options = {**source_options, "streamName": stream, ENDPOINT_OPTION[service]: proxy.url,
                   "maxRetries": "60", "retryBaseDelayMs": "200"}
        app = options["applicationName"]
        watch = RegressionWatch(ddb, app)
        try:
            with running(spark, options, tmp_path / "ck") as (query, sink):
                wait_for(lambda: sink.count() >= 200, timeout=180, what="200 rows")
                wait_committed(ddb, app, stream, producer.sent, timeout=120)
                delivered_before = sink.count()
                started = time.monotonic()
                proxy.fail(OPS[service], 1.0, 503)
                producer.put(100)  # arrives during the outage
                time.sleep(harness.OUTAGE_S / 2)  # the outage itself: real time, by definition
                proxy.clear()
                proxy.down = True
                time.sleep(harness.OUTAGE_S / 2)
                still_active = query.isActive and query.exception() is None
                during = sink.count() - delivered_before
                proxy.down = False
                outage_s = time.monotonic() - started
                resumed = time.monotonic()
                wait_for(lambda: sink.count() >= 300, timeout=300, what="the records of the outage")
                wait_committed(ddb, app, stream, producer.sent, timeout=300)
                resume_s = time.monotonic() - resumed
                failed_503 = sum(1 for s in proxy.operations() if s.injected == "InternalFailure")
                dropped = proxy.injected(DROPPED)
        finally:
            watch.stop()
    assert still_active, "the query gave up during an outage shorter than its retries"
    assert failed_503 + dropped > 0, "the outage hit no call"
    assert sorted(keys(sink.rows())) == sorted((p.shard_id, p.seq) for p in producer.sent), \
        "not every record exactly once"
    assert watch.regressions == [] and watch.observations > 10
    harness.publish(f"{service}-outage-resume", outage_s=round(outage_s, 1), resume_s=round(resume_s, 1),
                    answered_5xx=failed_503, dropped=dropped, rows_during_outage=during,
                    records=len(producer.sent), lost=0, duplicated=0)


CASES = [("dynamodb", "5xx"), ("kinesis", "drop")]


@pytest.mark.parametrize("service,mode", CASES)
def test_outage_beyond_retries_fails_clearly_and_loses_nothing(
    service, mode, spark, kinesis, kinesis_backend, ddb, endpoint, make_stream, source_options, tmp_path
):
    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    producer.put(100)
    # the proxy stands in front of the service that goes down (Kinesis: the backend under test)
    with FaultProxy(kinesis_backend if service == "kinesis" else endpoint.url) as proxy:
        options = {**source_options, "streamName": stream, ENDPOINT_OPTION[service]: proxy.url,
                   "maxRetries": "2", "retryBaseDelayMs": "100"}
        app = options["applicationName"]
        watch = RegressionWatch(ddb, app)
        try:
            with running(spark, options, tmp_path / "ck1") as (query, first):
                wait_for(lambda: first.count() >= 100, timeout=180, what="100 rows")
                wait_committed(ddb, app, stream, producer.sent, timeout=120)
                before = stored(ddb, app)
                if mode == "5xx":
                    proxy.fail(OPS[service], 1.0, 503)
                else:
                    proxy.down = True
                producer.put(50)
                started = time.monotonic()
                wait_for(lambda: not query.isActive, timeout=max(120, 4 * harness.OUTAGE_S),
                         what="the query to fail after its retries")
                failed_after = time.monotonic() - started
                message = str(query.exception())
            after = stored(ddb, app)
            proxy.clear()
            # a restart without the Spark checkpoint resumes from DynamoDB: nothing is lost
            with running(spark, options, tmp_path / "ck2") as (_, second):
                want = {(p.shard_id, p.seq) for p in producer.sent}
                wait_for(lambda: want <= set(keys(first.rows())) | set(keys(second.rows())),
                         timeout=180, what="every record after the restart")
        finally:
            watch.stop()
    assert all(order_key(after[k]) >= order_key(p) for k, p in before.items()), "a position regressed"
    assert watch.regressions == []
    deliveries = [Delivery("first", 0, tuple(keys(first.rows()))), Delivery("second", 0, tuple(keys(second.rows())))]
    report = check(((p.shard_id, p.seq) for p in producer.sent), deliveries)
    assert report.total("lost") == 0 and report.total("invented") == 0
    harness.publish(f"{service}-outage-fail-{mode}", failed_after_s=round(failed_after, 1),
                    records=len(producer.sent), lost=report.total("lost"),
                    duplicated=report.total("duplicated"), message=message.splitlines()[0][:200] if message else "")
    # clear: says what failed after how many retries, or where
    if mode == "5xx":
        assert "InternalFailure" in message and "max retries" in message, message[-1500:]
    else:
        assert proxy.url in message, "the error does not name the endpoint"
    if service == "kinesis":
        assert stream in message, "the error does not name the stream"


def test_dynamodb_outage_error_names_the_table_and_application(
    spark, kinesis, ddb, endpoint, make_stream, source_options, tmp_path
):
    stream = make_stream(1)
    producer = Producer(kinesis, stream)
    producer.put(20)
    with FaultProxy(endpoint.url) as proxy:
        options = {**source_options, "streamName": stream, "dynamodbEndpointUrl": proxy.url,
                   "maxRetries": "2", "retryBaseDelayMs": "100"}
        with running(spark, options, tmp_path / "ck") as (query, sink):
            wait_for(lambda: sink.count() >= 20, timeout=180, what="20 rows")
            proxy.fail(OPS["dynamodb"], 1.0, 503)
            producer.put(10)
            wait_for(lambda: not query.isActive, timeout=120, what="the query to fail")
            message = str(query.exception())
    assert "InternalFailure" in message  # it did fail on the outage
    assert TABLE in message and options["applicationName"] in message, message[-1500:]
