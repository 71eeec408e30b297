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
    with QuotaProxy(kinesis_backend, count_records=True) as quota, Feeder(kinesis, stream, shards, RATE) as feed:
        options["endpointUrl"] = quota.url
        with Neighbour(quota.url, stream, shards) as neighbour, running(
            spark, options, tmp_path / "ck"
        ) as (query, sink):
            wait_for(lambda: sink.count() > 0, timeout=120, what="the first records")
            since, steady_from = time.monotonic(), len(feed.sent)
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
    # In steady state each probe reads its shard's new records and the partition carries them
    # to the executor: most ranges are read by no executor call, and each record is read from
    # Kinesis about once (reading past a range's end and again as the next range was twice).
    last = source_report(progress[-1])
    assert last["rangesCarried"] >= 2 * last["executorReadsBooked"], last
    executor_iterators = len(quota.calls("GetShardIterator", where=lambda s: ours(s) and s.client == "sync"))
    assert executor_iterators <= last["executorReadsBooked"] / 2 + 1
    # Counted per record fed in the measured steady state (the start's backlog is read by a
    # probe and then by the first ranges' executors, by design; under load it is larger).
    assert quota.reads_of is not None
    steady = sent[steady_from:]
    reads = [quota.reads_of.get(("local", stream, shard, seq), []) for shard, seq, _ in steady]
    assert all(reads), "a record in the sink that no call of ours read"
    twice = [(seq, r) for (_, seq, _), r in zip(steady, reads, strict=True) if len(r) > 1]
    assert sum(map(len, reads)) <= 1.25 * len(steady), (len(steady), len(twice), twice[:5])
    # Exact: every record fed up to then, once, in order per shard.
    got = [(r.shard_id, r.seq) for r in sink.rows()]
    assert len(got) == len(set(got))
    for shard in shards:
        mine = [seq for sh, seq, _ in sent if sh == shard]
        assert [seq for sh, seq in got if sh == shard][: len(mine)] == mine
