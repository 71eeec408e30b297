"""Kinesis faults through the fault-injecting proxy: throttling and trimmed data."""

from __future__ import annotations

import logging

import pytest

from kinesis_source.aws.clients import AwsSettings
from kinesis_source.executor.polling import RangeReader
from kinesis_source.positions import Position, ShardRange
from tests.support.committed import wait_committed
from tests.support.producer import Producer
from tests.support.proxy import THROTTLED, FaultProxy
from tests.support.spark_query import Collector, failure_of, running
from tests.support.waiting import wait_for

pytestmark = pytest.mark.spark


@pytest.mark.backends("moto")
def test_throttled_reads_are_retried_and_every_record_arrives_once(
    spark, kinesis, kinesis_backend, make_stream, source_options, tmp_path
):
    """The refusals come from the proxy, not the server, so one implementation is enough here
    (the throttling storm in ``tests/chaos`` runs on kinesis-local): each run takes 1.5 minutes
    of CI."""
    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    producer.put(600)
    with FaultProxy(kinesis_backend) as proxy:
        proxy.throttle({"GetRecords", "GetShardIterator"}, 0.3)
        options = {**source_options, "streamName": stream, "endpointUrl": proxy.url,
                   "retryBaseDelayMs": "20", "maxRecordsPerFetch": "100"}
        with running(spark, options, tmp_path / "ck") as (query, sink):
            wait_for(lambda: sink.count() >= 600, timeout=180, what="600 rows")
            producer.put(400)
            wait_for(lambda: sink.count() >= 1000, timeout=180, what="1,000 rows")
            assert query.isActive
        throttled = proxy.injected(THROTTLED)
    got = [(r.shard_id, r.seq) for r in sink.rows()]
    assert len(got) == len(set(got)) == 1000
    assert sorted(got) == sorted((p.shard_id, p.seq) for p in producer.sent)
    assert throttled >= 10, f"only {throttled} calls were throttled"


@pytest.mark.backends("moto")
def test_retries_are_logged_at_debug_level(endpoint, kinesis, make_stream, caplog):
    stream = make_stream(1)
    sent = Producer(kinesis, stream).put(50)
    with FaultProxy(endpoint.url) as proxy:
        proxy.throttle({"GetRecords"}, 0.5)
        settings = AwsSettings(region="us-east-1", endpoint_url=proxy.url, retry_base_delay_ms=5)
        client = settings.boto3_client("kinesis")
        rng = ShardRange(stream, sent[0].shard_id, Position.trim_horizon(), sent[-1].seq)
        with caplog.at_level(logging.DEBUG, logger="kinesis_source.aws.retries"):
            pages = list(RangeReader(client, rng, limit=5).pages())
    assert sum(len(p) for p in pages) == 50
    retried = [r for r in caplog.records if "(throttled)" in r.getMessage()]
    assert len(retried) == proxy.injected(THROTTLED) > 0


@pytest.mark.backends("moto")
def test_a_refused_kms_key_names_the_permission(endpoint, kinesis, make_stream):
    """Issue 22 item 5, polling side: KMS errors say what to check, naming stream and shard."""
    from kinesis_source.errors import KinesisSourceError

    stream = make_stream(1)
    sent = Producer(kinesis, stream).put(5)
    with FaultProxy(endpoint.url) as proxy:
        proxy.fail({"GetRecords"}, 1.0, status=400, code="KMSAccessDeniedException")
        client = AwsSettings(region="us-east-1", endpoint_url=proxy.url, max_retries=0).boto3_client("kinesis")
        rng = ShardRange(stream, sent[0].shard_id, Position.trim_horizon(), sent[-1].seq)
        with pytest.raises(KinesisSourceError) as err:
            list(RangeReader(client, rng, limit=5).pages())
    message = str(err.value)
    assert "kms:Decrypt" in message and stream in message and sent[0].shard_id in message


def test_trimmed_position_fails_or_goes_on_as_configured(
    spark, kinesis, kinesis_backend, ddb, make_stream, source_options, tmp_path
):
    stream = make_stream(1)
    producer = Producer(kinesis, stream)
    producer.put(100)
    with FaultProxy(kinesis_backend) as proxy:
        options = {**source_options, "streamName": stream, "endpointUrl": proxy.url}
        with running(spark, options, tmp_path / "ck1") as (_, first):
            wait_for(lambda: first.count() >= 100, timeout=90, what="100 rows")
            wait_committed(ddb, options["applicationName"], stream, producer.sent)
        later = producer.put(50)
        # Retention trims everything up to the 20th new record while no query runs.
        shard = later[0].shard_id
        proxy.trim(stream, shard, later[20].seq)

        message = failure_of(spark, options, tmp_path / "ck2")  # resumes from DynamoDB
        assert f"Records of Kinesis stream '{stream}' shard '{shard}' after position " in message
        assert f"AFTER:{producer.sent[99].seq}" in message
        assert f"the oldest record left is {later[20].seq}" in message
        assert "failOnDataLoss=false" in message

        lenient = {**options, "failOnDataLoss": "false"}
        with running(spark, lenient, tmp_path / "ck3") as (query, sink):
            wait_for(lambda: sink.count() >= 30, timeout=90, what="the records left")
            assert query.isActive
    assert [r.seq for r in sink.rows()] == [p.seq for p in later[20:]]


def test_shard_gone_since_the_listing_is_data_loss_as_failOnDataLoss_says(
    spark, kinesis, kinesis_backend, make_stream, source_options, tmp_path
):
    """Issue 14 item 8: a shard that expired between ListShards and GetShardIterator was
    reported as "stream not found" (check option 'streamName') and failed the query whatever
    failOnDataLoss said, on the driver's probe and on every replay of a planned batch."""
    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    sent = producer.put(60)
    gone, kept = sorted({p.shard_id for p in sent})
    with FaultProxy(kinesis_backend) as proxy:
        options = {**source_options, "streamName": stream, "endpointUrl": proxy.url}
        # Batch 0 is planned and written to Spark's offset log, then the sink fails it.
        sink = Collector(fail_batches={0})
        with running(spark, options, tmp_path / "ck", sink) as (query, _):
            wait_for(lambda: not query.isActive, timeout=90, what="batch 0 to fail in the sink")
        assert len(sink.batches(0)) == 1 and len(sink.batches(0)[0]) == 60
        proxy.expire(stream, gone, listed=True)  # still listed: gone only for GetShardIterator

        # The replay of batch 0 reads the gone shard's planned range: data loss, named.
        message = failure_of(spark, options, tmp_path / "ck")
        assert f"Kinesis stream '{stream}' no longer has shard '{gone}'" in message
        assert "failOnDataLoss=false" in message
        assert "option 'streamName'" not in message

        lenient = {**options, "failOnDataLoss": "false"}
        replay = Collector()
        with running(spark, lenient, tmp_path / "ck", replay) as (query, _):
            wait_for(lambda: replay.batches(0), timeout=90, what="the replay of batch 0")
            later = producer.put(20, hash_key=_hash_key_of(kinesis, stream, kept))
            want = len([p for p in sent if p.shard_id == kept]) + len(later)
            wait_for(lambda: replay.count() >= want, timeout=90, what="the kept shard's records")
            assert query.isActive
    assert [r.seq for r in replay.batches(0)[0]] == [p.seq for p in sent if p.shard_id == kept]
    assert [r.seq for r in replay.rows()] == [p.seq for p in sent + later if p.shard_id == kept]

    # On the driver: a new query whose first probe meets the gone shard.
    with FaultProxy(kinesis_backend) as proxy:
        proxy.expire(stream, gone, listed=True)
        options = {**source_options, "streamName": stream, "endpointUrl": proxy.url}
        message = failure_of(spark, options, tmp_path / "ck2")
        assert f"Kinesis stream '{stream}' no longer has shard '{gone}'" in message
        assert "option 'streamName'" not in message


def _hash_key_of(kinesis, stream, shard_id):
    shards = kinesis.list_shards(StreamName=stream)["Shards"]
    return next(s["HashKeyRange"]["StartingHashKey"] for s in shards if s["ShardId"] == shard_id)
