"""The source as a good citizen of each shard's read quota, on the quota-enforcing server: a
steady producer, Spark's default trigger, and a neighbour application polling every shard."""

from __future__ import annotations

import time

import pytest

from tests.support.quota import Feeder, Neighbour, QuotaProxy, as_users_run
from tests.support.spark_query import running, source_report
from tests.support.waiting import wait_for

pytestmark = pytest.mark.spark

SHARDS = 4
RATE = 50  # records per second per shard
RUN_S = 30  # measured after the first batch
def test_a_steady_query_keeps_to_its_call_budget_beside_a_neighbour(
    spark, kinesis, kinesis_backend, make_stream, source_options, tmp_path
):
    stream = make_stream(SHARDS)
    shards = [s["ShardId"] for s in kinesis.list_shards(StreamName=stream)["Shards"]]
    options = as_users_run(source_options)
    options.update(streamName=stream, initialPosition="TRIM_HORIZON")
    with QuotaProxy(kinesis_backend) as quota, Feeder(kinesis, stream, shards, RATE) as feed:
        options["endpointUrl"] = quota.url
        with Neighbour(quota.url, stream, shards) as neighbour, running(
            spark, options, tmp_path / "ck"
        ) as (query, sink):
            wait_for(lambda: sink.count() > 0, timeout=120, what="the first records")
            since = time.monotonic()
            # The run is measured for RUN_S seconds of steady state, then until the query
            # holds every record fed by then.
            wait_for(lambda: time.monotonic() - since >= RUN_S and query.isActive, timeout=RUN_S + 30,
                     interval=1.0, what="the measured run")
            sent = list(feed.sent)
            fed = {(sh, seq) for sh, seq, _ in sent}
            # every record fed by then (the sink also gets later ones, so a count is not enough)
            wait_for(lambda: fed <= {(r.shard_id, r.seq) for r in sink.rows()}, timeout=120,
                     interval=1.0, what=f"the {len(sent)} records fed")
            until = time.monotonic()
            progress = list(query.recentProgress)
    ours = lambda s: s.access_key == "local" and s.at >= since and s.at <= until  # noqa: E731
    assert quota.peak_rate("GetRecords", window_s=10.0, where=ours) <= 2.0
    assert quota.peak_rate("GetShardIterator", window_s=10.0, where=ours) <= 1.0
    assert quota.refused() == 0, [s for s in quota.calls(refused=True)][:5]
    assert neighbour.refused == 0 and neighbour.calls >= RUN_S * SHARDS * 0.8
    # Executors read on with the probes' iterators: far fewer iterators than reads.
    executor_reads = len(quota.calls("GetRecords", where=lambda s: ours(s) and s.client == "sync"))
    executor_iterators = len(quota.calls("GetShardIterator", where=lambda s: ours(s) and s.client == "sync"))
    assert executor_reads > 0 and executor_iterators <= executor_reads / 4
    # Executors report what they read past their ends, so the driver hardly probes shards that
    # batches read (without reports: one GetRecords per shard per minProbeIntervalMs, ~1/s).
    driver_reads = len(quota.calls("GetRecords", where=lambda s: ours(s) and s.client == "async"))
    driver_rate = driver_reads / SHARDS / (until - since)
    assert driver_rate <= 0.3, f"the driver made {driver_rate:.2f} GetRecords per shard per second"
    reports = max(source_report(p).get("tipReports", 0) for p in progress)
    assert reports > 0
    # Exact: every record fed up to then, once, in order per shard.
    got = [(r.shard_id, r.seq) for r in sink.rows()]
    assert len(got) == len(set(got))
    for shard in shards:
        mine = [seq for sh, seq, _ in sent if sh == shard]
        assert [seq for sh, seq in got if sh == shard][: len(mine)] == mine
