"""Fan-out with the driver holding each shard's subscription for the query's life
(``efoSubscriptions=query``, the default): real Spark reading through the test EFO server
(tests/support/efo_server.py), which counts every call, refusal and record it pushes."""

from __future__ import annotations

import pytest

from tests.integration.test_stream_read import assert_exactly_once_in_order
from tests.support.efo_server import EfoServer
from tests.support.producer import Producer
from tests.support.spark_query import Collector, running, source_report
from tests.support.waiting import wait_for

pytestmark = pytest.mark.spark


def _options(source_options, stream, server, name):
    return {**source_options, "streamName": stream, "endpointUrl": server.url, "consumerMode": "efo",
            "consumerName": name, "deregisterConsumer": "true"}


def _fed(producer, sink, batches):
    """``batches`` rounds of 12 records each, every round waited for at the sink."""
    for _ in range(batches):
        producer.put(12)
        wait_for(lambda: sink.count() >= len(producer.sent), timeout=120, what=f"{len(producer.sent)} rows")


@pytest.mark.backends("moto")  # the driver's side: the EFO server fronts either backend alike
def test_held_subscriptions_receive_each_record_once_and_make_no_call_per_batch(
    spark, kinesis_backend, kinesis, make_stream, source_options, tmp_path
):
    """Steady state: one subscription per shard for the whole run (none per batch), no
    GetRecords or GetShardIterator, every record pushed once by the server and delivered once,
    in order, and no subscription refused."""
    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    with EfoServer(kinesis_backend, activation_delay_s=0.3) as server:
        with running(spark, _options(source_options, stream, server, "held"), tmp_path / "q") as (query, sink):
            _fed(producer, sink, 2)
            wait_for(lambda: query.lastProgress and source_report(query.lastProgress).get("heldShards") == 2,
                     timeout=60, what="both shards held by the driver")
            before, subscribed, sent = dict(server.calls), server.subscriptions, server.sent_bytes
            delivered = sum(len(r.data) for r in sink.rows())
            _fed(producer, sink, 6)
            after = dict(server.calls)
            assert after.get("GetRecords", 0) == before.get("GetRecords", 0), (before, after)
            assert after.get("GetShardIterator", 0) == before.get("GetShardIterator", 0), (before, after)
            assert server.subscriptions == subscribed, "a batch opened a subscription"
            batches = {bid for bid, rows in sink.deliveries if rows}
            assert len(batches) >= 6
            # every record pushed once: what the server sent is what reached the sink
            assert server.sent_bytes - sent == sum(len(r.data) for r in sink.rows()) - delivered
            report = source_report(query.lastProgress)
            assert report["rangesCarried"] >= 6 and report["executorReadsBooked"] == 0
        assert_exactly_once_in_order(sink.rows(), producer.sent)
        assert server.refused == {"ResourceInUseException": 0, "LimitExceededException": 0}
        wait_for(lambda: server.live_subscriptions() == 0, timeout=60, what="the subscriptions to end with the query")


class CountingFirst(Collector):
    """A sink that runs two actions on each batch, unpersisted: a count, then the collect."""

    def __call__(self, df, batch_id):
        self.counted = df.count()
        super().__call__(df, batch_id)


@pytest.mark.backends("moto")
def test_a_batch_planned_twice_hands_its_held_records_out_once(
    spark, kinesis_backend, kinesis, make_stream, source_options, tmp_path
):
    """A ``foreachBatch`` running two actions on each batch (unpersisted) keeps held mode's
    promise: no range falls to an executor's own subscription (which would end the driver's
    and receive the records again), each record is received once. (pyspark 4.0 plans such a
    batch once, measured; a scan that plans it again gets the same partitions.)"""
    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    with EfoServer(kinesis_backend, activation_delay_s=0.3) as server:
        opts = _options(source_options, stream, server, "twice")
        with running(spark, opts, tmp_path / "q", sink=CountingFirst()) as (query, sink):
            _fed(producer, sink, 2)
            wait_for(lambda: query.lastProgress and source_report(query.lastProgress).get("heldShards") == 2,
                     timeout=60, what="both shards held by the driver")
            subscribed, sent = server.subscriptions, server.sent_bytes
            delivered = sum(len(r.data) for r in sink.rows())
            _fed(producer, sink, 4)
            assert server.subscriptions == subscribed, "a batch planned twice opened a subscription"
            assert server.sent_bytes - sent == sum(len(r.data) for r in sink.rows()) - delivered
            assert source_report(query.lastProgress)["executorReadsBooked"] == 0
        assert_exactly_once_in_order(sink.rows(), producer.sent)


@pytest.mark.backends("moto")
def test_a_subscription_given_up_leaves_its_shard_to_probes_and_executors_then_is_held_again(
    spark, kinesis_backend, kinesis, make_stream, source_options, tmp_path
):
    """An error a new subscription cannot get past (here an exception event the driver does not
    retry) ends the driver's subscription of a shard: its probes find the shard's new records,
    an executor's own subscription reads their range, and the driver holds the shard again
    after it. Nothing is lost or repeated, and the shard is never left unread."""
    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    with EfoServer(kinesis_backend, activation_delay_s=0.3) as server:
        with running(spark, _options(source_options, stream, server, "given-up"), tmp_path / "q") as (query, sink):
            _fed(producer, sink, 2)
            wait_for(lambda: query.lastProgress and source_report(query.lastProgress).get("heldShards") == 2,
                     timeout=60, what="both shards held by the driver")
            server.inject_error("KMSAccessDeniedException", after_events=1, times=1)
            wait_for(lambda: (producer.put(2) or True) and source_report(query.lastProgress).get("heldGivenUp", 0) >= 1,
                     timeout=60, what="a driver subscription given up", interval=1.0)
            _fed(producer, sink, 4)
            wait_for(lambda: (producer.put(2) or True) and source_report(query.lastProgress).get("heldShards") == 2,
                     timeout=90, what="the shard held again", interval=1.0)
            _fed(producer, sink, 1)
            report = source_report(query.lastProgress)
            assert report["driverSubscriptions"] >= 3  # both shards', then the one held again
            assert server.subscriptions > report["driverSubscriptions"], "no executor read the shard"
        assert_exactly_once_in_order(sink.rows(), producer.sent)
        assert server.injected == {"KMSAccessDeniedException": 1}


@pytest.mark.backends("moto")
def test_a_full_run_pauses_its_subscription_and_resumes_it_without_a_new_one(
    spark, kinesis_backend, kinesis, make_stream, source_options, tmp_path
):
    """More than a held shard's run may hold (4 MiB) arrives between two batches (a trigger of
    8 s): the subscription stops reading, kept open, and reads on once a batch took the run;
    no new subscription (which would wait out Kinesis' 5 s rule after each batch), every record
    once, in order."""
    stream = make_stream(1)
    producer = Producer(kinesis, stream)
    with EfoServer(kinesis_backend, activation_delay_s=0.3) as server:
        opts = _options(source_options, stream, server, "paused")
        with running(spark, opts, tmp_path / "q", trigger_ms=8000) as (query, sink):
            _fed(producer, sink, 1)
            wait_for(lambda: query.lastProgress and source_report(query.lastProgress).get("heldShards") == 1,
                     timeout=60, what="the shard held by the driver")
            subscribed = server.subscriptions
            big = [f"big-{i:03d}-".encode().ljust(64 * 1024, b"x") for i in range(100)]  # 6.4 MiB
            for at in range(0, len(big), 10):
                kinesis.put_records(StreamName=stream, Records=[
                    {"Data": data, "PartitionKey": "k"} for data in big[at:at + 10]])
            wait_for(lambda: sum(len(r.data) for r in sink.rows()) >= 100 * 64 * 1024, timeout=180,
                     what="the 100 large records")
            # the sink holds a batch's rows before Spark posts that batch's progress (ci68 read
            # the progress before it): the pause shows in a progress posted since
            wait_for(lambda: source_report(query.lastProgress).get("heldPauses", 0) >= 1, timeout=60,
                     what=lambda: f"a pause counted in the progress: {source_report(query.lastProgress)}")
            assert server.subscriptions == subscribed, "the pause cost a new subscription"
        delivered = [r.data for r in sink.rows() if r.data.startswith(b"big-")]
        assert delivered == big  # each once, in order
        assert server.refused == {"ResourceInUseException": 0, "LimitExceededException": 0}


@pytest.mark.backends("moto")
def test_held_subscriptions_renewed_and_broken_lose_and_repeat_nothing(
    spark, kinesis_backend, kinesis, make_stream, source_options, tmp_path
):
    """Kinesis ends each subscription (after 5 minutes; here after 3 events), and a subscription
    may break (an exception event, a dropped connection): the driver renews it at the last
    record it received, checked to come first again, and the rows stay exact."""
    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    with EfoServer(kinesis_backend, activation_delay_s=0.3, page_limit=5) as server:
        server.end_after_events = 3
        with running(spark, _options(source_options, stream, server, "renewed"), tmp_path / "q") as (query, sink):
            _fed(producer, sink, 2)
            server.inject_error("InternalFailureException", after_events=1, times=2)
            server.drop_connection(after_events=1, times=2)
            _fed(producer, sink, 4)
            report = source_report(query.lastProgress)
            assert report["heldGivenUp"] == 0
            assert report["driverSubscriptions"] > 4, "no subscription was renewed"
        assert_exactly_once_in_order(sink.rows(), producer.sent)
        assert sum(server.injected.values()) == 4, server.injected  # two exception events, two drops
        assert server.refused == {"ResourceInUseException": 0, "LimitExceededException": 0}


@pytest.mark.backends("moto")
def test_a_batch_replayed_after_a_restart_is_read_exactly_then_held_again(
    spark, kinesis_backend, kinesis, make_stream, source_options, tmp_path
):
    """A run stopped after writing a batch's offsets and before its commit: the next run replays
    that batch from Spark's offset log. The new driver never received it, so its executors
    read it with their own subscriptions; then the driver holds the shards again."""
    from tests.support.spark_query import Collector

    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    with EfoServer(kinesis_backend, activation_delay_s=0.3) as server:
        options = _options(source_options, stream, server, "replayed")
        failing = Collector(fail_batches={2})
        with running(spark, options, tmp_path / "q", sink=failing) as (query, _):
            # records keep coming until batches 0-2 ran (an empty stream runs no batch)
            wait_for(lambda: not producer.put(5) or not query.isActive, timeout=120, interval=0.5,
                     what="the sink to fail batch 2")
        replayed = {bid: rows for bid, rows in failing.deliveries}[2]
        assert replayed, "batch 2 held no row"
        before = [row for bid, rows in failing.deliveries if bid < 2 for row in rows]
        with running(spark, options, tmp_path / "q") as (query, sink):
            wait_for(lambda: sink.deliveries, timeout=120, what="the replayed batch")
            assert sink.deliveries[0] == (2, replayed)  # the same rows, in the same order

            def fed(batches):
                for _ in range(batches):
                    producer.put(12)
                    wait_for(lambda: len(before) + sink.count() >= len(producer.sent), timeout=120,
                             what=f"{len(producer.sent)} rows")

            fed(3)
            wait_for(lambda: source_report(query.lastProgress).get("heldShards") == 2,
                     timeout=60, what="both shards held again")
            fed(2)
        assert_exactly_once_in_order(before + sink.rows(), producer.sent)
        assert server.refused["LimitExceededException"] == 0, server.timeline()


@pytest.mark.backends("kinesis-local")  # (moto never ends a closed shard)
def test_a_split_ends_the_parents_subscription_and_the_children_are_held_in_order(
    spark, kinesis_backend, kinesis, make_stream, source_options, tmp_path
):
    """A shard split while held: the parent's subscription ends with the shard, its last
    records go in a batch, and each child, once its parent's end is committed, is held from
    its first record: every record once, each key's records in order, no subscription given
    up."""
    from tests.integration.test_resharding import KeyedProducer, split_in_two

    stream = make_stream(1)
    (parent,) = [s["ShardId"] for s in kinesis.list_shards(StreamName=stream)["Shards"]]
    with EfoServer(kinesis_backend, activation_delay_s=0.3) as server:
        options = {**_options(source_options, stream, server, "split"), "shardDiscoveryIntervalMs": "500"}
        with KeyedProducer(kinesis, stream, keys=6, burst=4) as producer, \
                running(spark, options, tmp_path / "q") as (query, sink):
            wait_for(lambda: sink.count() >= 100, timeout=120, what="rows from the parent")
            split_in_two(kinesis, stream, parent)
            wait_for(lambda: len({r.shard_id for r in sink.rows()} - {parent}) == 2, timeout=120,
                     what="rows from both children")
            producer.stop()
            assert producer.error is None, producer.error
            wait_for(lambda: sink.count() >= len(producer.sent), timeout=120, what="every record")
            report = source_report(query.lastProgress)
        got = [(r.shard_id, r.seq, r.data) for r in sink.rows()]
        assert len(got) == len(set(got)) and sorted(got) == sorted(producer.sent)
        last: dict[str, int] = {}
        for r in sink.rows():
            key, n = r.data.decode().split(":")
            assert int(n) == last.get(key, -1) + 1, f"{key}: {n} after {last.get(key)}"
            last[key] = int(n)
        assert report["heldShards"] == 2 and report["heldGivenUp"] == 0, report
