"""Per-shard lag in progress events, turned into reports and gauges in the user's process."""

from __future__ import annotations

import time

import pytest

from kinesis_source.metrics import KinesisLagListener
from tests.support.boto3_reads import read_range_boto3
from tests.support.producer import Producer
from tests.support.spark_query import running, source_report
from tests.support.waiting import wait_for

pytestmark = pytest.mark.spark


def test_lag_listener_reports_per_shard_lag_and_sets_gauges(
    spark, kinesis, make_stream, source_options, tmp_path
):
    """The first batch's lag per shard is what the records' arrival timestamps imply, and the
    gauges hold it. Mutant caught: the max gauge set to 0 (``gauge >= 0`` passed it)."""
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
    gauges = []  # what the gauges said as each report was made (they are set just before)

    def seen(report):
        query = report.query_name or report.query_id
        gauges.append({
            key: registry.get_sample_value(
                "kinesis_ddb_millis_behind_latest", {"query": query, "shard": key}
            )
            for key in report.millis_behind
        } | {"max": registry.get_sample_value("kinesis_ddb_max_millis_behind_latest", {"query": query})})
        reports.append(report)

    listener = KinesisLagListener(seen, registry=registry)
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
    # The first batch started at TRIM_HORIZON with both bursts in the stream: per shard, its tip
    # is the last record PutRecords acknowledged there, and its lag is how much later that
    # record arrived than the shard's first one (the server's arrival timestamps, read back
    # with plain boto3 calls).
    first = reports[0]
    assert first.batch_id == 0
    implied = {}
    for key in shards:
        shard = key.rpartition("/")[2]
        puts = [p for p in producer.sent[:200] if p.shard_id == shard]
        assert first.tips[key] == puts[-1].seq
        records = read_range_boto3(kinesis, stream, shard, "TRIM_HORIZON", puts[-1].seq)
        assert [r["SequenceNumber"] for r in records] == [p.seq for p in puts]
        span = records[-1]["ApproximateArrivalTimestamp"] - records[0]["ApproximateArrivalTimestamp"]
        implied[key] = span.total_seconds() * 1000
    for key, ms in implied.items():
        assert ms >= 1000  # the bursts were a second apart
        assert abs(first.millis_behind[key] - ms) <= 2, (first.millis_behind, implied)
        assert gauges[0][key] == first.millis_behind[key]
    assert gauges[0]["max"] == max(first.millis_behind.values())
    # The gauge holds the query's last report when the query has stopped.
    mine = [r for r in reports if r.query_id == caught_up.query_id]
    gauge = registry.get_sample_value(
        "kinesis_ddb_max_millis_behind_latest", {"query": caught_up.query_name or caught_up.query_id}
    )
    assert gauge == mine[-1].max_millis_behind
