"""Sparse shards as real Kinesis serves them: empty pages with MillisBehindLatest > 0 before
the records (issue 14 item 2), injected by the test proxy in front of a real server."""

from __future__ import annotations

import pytest

from tests.support.producer import Producer
from tests.support.proxy import FaultProxy
from tests.support.quota import QuotaProxy, as_users_run
from tests.support.spark_query import read_available_now, running
from tests.support.waiting import wait_for

pytestmark = pytest.mark.spark

GAP = 12  # more empty pages than one probe follows


def _one_shard_with(kinesis, make_stream, count):
    """A one-shard stream holding ``count`` records; its producer and what it put."""
    producer = Producer(kinesis, make_stream(1))
    return producer, producer.put(count)


def _through_gap(proxy, source_options, producer, initial):
    """Query options through ``proxy``, which makes the producer's shard sparse."""
    proxy.gap(producer.stream, producer.sent[0].shard_id, GAP)
    return {**source_options, "streamName": producer.stream, "endpointUrl": proxy.url,
            "initialPosition": initial}


def test_trim_horizon_start_crosses_the_empty_pages_and_reads_everything(
    spark, kinesis, kinesis_backend, make_stream, source_options, tmp_path
):
    producer, sent = _one_shard_with(kinesis, make_stream, 40)
    with FaultProxy(kinesis_backend) as proxy:
        options = _through_gap(proxy, source_options, producer, "TRIM_HORIZON")
        with running(spark, options, tmp_path / "ck") as (query, sink):
            wait_for(lambda: sink.count() >= 40, timeout=120, what="the 40 records")
            assert query.isActive
        assert proxy.gap_pages_served >= GAP
    assert [r.seq for r in sink.rows()] == [p.seq for p in sent]


def test_latest_behind_empty_pages_starts_after_the_newest_record(
    spark, kinesis, kinesis_backend, make_stream, source_options, tmp_path
):
    """LATEST is resolved by probing for the tip; a probe that gave up on the empty pages made
    LATEST a TRIM_HORIZON and re-read the 30 older records."""
    producer, _ = _one_shard_with(kinesis, make_stream, 30)  # older records, not to be read
    with FaultProxy(kinesis_backend) as proxy:
        options = _through_gap(proxy, source_options, producer, "LATEST")
        with running(spark, options, tmp_path / "ck") as (query, sink):
            wait_for(lambda: query.lastProgress is not None, timeout=120, what="the first trigger")
            new = producer.put(20)
            wait_for(lambda: sink.count() >= 20, timeout=120, what="the 20 new records")
            assert query.isActive
    assert [r.seq for r in sink.rows()] == [p.seq for p in new]


def test_available_now_reads_a_sparse_shard_to_its_newest_record(
    spark, kinesis, kinesis_backend, make_stream, source_options, tmp_path
):
    """The AvailableNow target probes every open shard for its newest record; a shard whose
    probe gave up on the empty pages was dropped from the run."""
    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    sent = producer.put(60)
    sparse = sent[0].shard_id
    with FaultProxy(kinesis_backend) as proxy:
        proxy.gap(stream, sparse, GAP)
        options = {**source_options, "streamName": stream, "endpointUrl": proxy.url,
                   "initialPosition": "TRIM_HORIZON"}
        sink = read_available_now(spark, options, tmp_path / "ck")
    got = sorted((r.shard_id, r.seq) for r in sink.rows())
    assert got == sorted((p.shard_id, p.seq) for p in sent)
    assert any(r.shard_id == sparse for r in sink.rows())


class _NamingQuotaProxy(QuotaProxy):
    """The quota server, noting whether each ``GetRecords`` named its stream by ARN."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.without_arn = 0

    def _describe(self, call, body):
        call = super()._describe(call, body)
        if call.operation == "GetRecords" and b'"StreamARN"' not in body:
            with self._lock:
                self.without_arn += 1
        return call


@pytest.mark.backends("moto")  # the driver's pacing: the same on either server
def test_a_sparse_shard_is_read_within_the_call_budget_every_call_naming_its_shard_and_stream(
    spark, kinesis, kinesis_backend, make_stream, source_options, tmp_path
):
    """Issue 46 item 2 end to end: a probe crossing a sparse shard's empty pages kept to the
    per-shard budget and named the stream by ARN in every call (its last reads once ran on
    iterators the driver had forgotten: unpaced and without ``StreamARN``). Counted at the
    quota server, per shard and per second, driver and executors together."""
    producer, sent = _one_shard_with(kinesis, make_stream, 40)
    arn = kinesis.describe_stream_summary(StreamName=producer.stream)["StreamDescriptionSummary"]["StreamARN"]
    options = {k: v for k, v in as_users_run(source_options).items() if k != "region"}
    options.update(streamARN=arn, initialPosition="TRIM_HORIZON")
    with _NamingQuotaProxy(kinesis_backend) as quota:
        quota.gap(producer.stream, producer.sent[0].shard_id, GAP)
        options["endpointUrl"] = quota.url
        sink = read_available_now(spark, options, tmp_path / "ck")
        assert quota.gap_pages_served >= GAP
    assert [r.seq for r in sink.rows()] == [p.seq for p in sent]
    ours = lambda s: s.access_key == "local"  # noqa: E731
    reads = quota.calls("GetRecords", where=ours) + quota.calls("GetShardIterator", where=ours)
    assert reads and [s for s in reads if s.shard is None] == [], "every call counted against its shard"
    assert quota.without_arn == 0
    assert quota.peak_rate("GetRecords", window_s=1.0, where=ours) <= 2.0
    assert quota.peak_rate("GetShardIterator", window_s=1.0, where=ours) <= 1.0
    assert quota.refused() == 0
