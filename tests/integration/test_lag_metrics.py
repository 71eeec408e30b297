"""Per-shard lag in progress events, turned into reports and gauges in the user's process."""

from __future__ import annotations

import time

import pytest

from kinesis_source.metrics import KinesisLagListener
from tests.support.producer import Producer
from tests.support.spark_query import running, source_report
from tests.support.waiting import wait_for

pytestmark = pytest.mark.spark


def test_lag_listener_reports_per_shard_lag_and_sets_gauges(
    spark, kinesis, make_stream, source_options, tmp_path
):
    from prometheus_client import CollectorRegistry

    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    producer.put(100)
    first_put = time.time()
    # the backlog spans a second of arrivals, so the first batch starts ~1 s behind the tip
    wait_for(lambda: time.time() > first_put + 1.0, timeout=5, what="a second to pass")
    producer.put(100)
    registry = CollectorRegistry()
    reports = []
    listener = KinesisLagListener(reports.append, registry=registry)
    spark.streams.addListener(listener)
    try:
        with running(spark, {**source_options, "streamName": stream}, tmp_path / "ck") as (query, sink):
            wait_for(lambda: sink.count() >= 200, timeout=90, what="200 rows")
            behind = wait_for(
                lambda: next((r for r in reports if r.max_millis_behind >= 700), None),
                timeout=30, what="a report of the backlog's lag",
            )
            # caught up, a new burst is read from right behind the tip
            producer.put(10)
            wait_for(lambda: sink.count() >= 210, timeout=90, what="the new burst")
            caught_up = wait_for(
                lambda: next((r for r in reports[reports.index(behind) + 1:]
                              if r.millis_behind and r.max_millis_behind < 200), None),
                timeout=30, what="a report of little lag once caught up",
            )
            report = source_report(query.lastProgress)
    finally:
        spark.streams.removeListener(listener)
    shards = {f"{stream}/{s['ShardId']}" for s in kinesis.list_shards(StreamName=stream)["Shards"]}
    assert set(behind.millis_behind) == shards == set(caught_up.millis_behind)
    assert set(report["shards"]) == shards  # the raw figures are in the progress JSON too
    gauge = registry.get_sample_value(
        "kinesis_ddb_max_millis_behind_latest", {"query": caught_up.query_name or caught_up.query_id}
    )
    assert gauge is not None and gauge >= 0
