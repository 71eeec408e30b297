"""Read limits and Trigger.AvailableNow end to end: real Spark local[2], a real Kinesis server."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest

from kinesis_source.positions import seq_key
from tests.integration.test_stream_read import assert_exactly_once_in_order
from tests.support.producer import Producer
from tests.support.quota import as_users_run
from tests.support.spark_query import Collector, read_to_end, running, start_triggered, stop_quietly
from tests.support.waiting import wait_for

pytestmark = pytest.mark.spark


def shard_hash_keys(kinesis, stream):
    """shard id -> an ExplicitHashKey that lands in it."""
    shards = kinesis.list_shards(StreamName=stream)["Shards"]
    return {s["ShardId"]: s["HashKeyRange"]["StartingHashKey"] for s in shards}


# moto only: kinesis-local throttles writes to one shard (~300 records/s here), so loading 9,000
# records into one shard costs a minute; the AvailableNow test below runs the limit there too.
@pytest.mark.backends("moto")
def test_backlog_read_in_batches_of_at_most_the_limit_with_every_shard_progressing(
    spark, kinesis, make_stream, source_options, tmp_path
):
    stream = make_stream(4)
    keys = shard_hash_keys(kinesis, stream)
    big, *small = sorted(keys)
    producer = Producer(kinesis, stream)
    producer.put(9000, burst=500, hash_key=keys[big])  # 90% of the data in one shard
    for shard, n in zip(small, (333, 333, 334), strict=True):
        producer.put(n, burst=500, hash_key=keys[shard])
    options = {**source_options, "streamName": stream, "maxRecordsPerBatch": "1000"}
    with running(spark, options, tmp_path / "ck") as (query, sink):
        wait_for(lambda: sink.count() >= 10_000, timeout=240, what="10,000 rows")
        assert_exactly_once_in_order(sink.rows(), producer.sent)
        sizes = [len(rows) for _, rows in sink.deliveries]
        assert max(sizes) <= 1000, sizes
        assert len(sizes) >= 10, sizes
        # A small shard with records left gets some of every batch: none waits for the big one.
        left = {s: sum(1 for p in producer.sent if p.shard_id == s) for s in small}
        for batch_id, rows in sink.deliveries:
            per_shard = defaultdict(int)
            for row in rows:
                per_shard[row.shard_id] += 1
            for shard in small:
                if left[shard] > 0:
                    assert per_shard[shard] > 0, f"shard {shard} got nothing in batch {batch_id}"
                left[shard] -= per_shard[shard]


def test_trigger_once_reads_everything_despite_the_limit(
    spark, kinesis, make_stream, source_options, tmp_path
):
    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    producer.put(500)
    options = {**source_options, "streamName": stream, "maxRecordsPerBatch": "100"}
    sink = read_to_end(spark, options, tmp_path / "ck", 180, once=True)
    assert len(sink.deliveries) == 1
    assert_exactly_once_in_order(sink.rows(), producer.sent)


def test_trigger_once_at_the_default_call_budget_reads_every_shards_records(
    spark, kinesis, make_stream, source_options, tmp_path
):
    # The first probe spends each shard's share of the budget; a shard whose executor read
    # could not start at once was held for a later batch, which a Trigger.Once run never has.
    stream = make_stream(4)
    producer = Producer(kinesis, stream)
    producer.put(400)
    sink = read_to_end(spark, as_users_run({**source_options, "streamName": stream}), tmp_path / "ck", 180, once=True)
    assert_exactly_once_in_order(sink.rows(), producer.sent)


class TimedProducer:
    """Puts records in a background thread until stopped, noting when each call began."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.calls: list[tuple[float, list]] = []  # (monotonic time the put began, its records)
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                began = time.monotonic()
                self.calls.append((began, self.producer.put(20, burst=20)))
                self._stop.wait(0.02)
        except BaseException as exc:  # surfaced by the test, not lost with the thread
            self.error = exc

    def __enter__(self) -> TimedProducer:
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        """True while the thread is still putting records."""
        return self._thread.is_alive()

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def test_available_now_reads_what_existed_at_its_start_and_stops(
    spark, kinesis, make_stream, source_options, tmp_path
):
    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    producer.put(2000, burst=500)
    options = {**source_options, "streamName": stream, "maxRecordsPerBatch": "400"}
    first_delivery: list[float] = []

    class StampedCollector(Collector):
        def __call__(self, df, batch_id):
            if not first_delivery:
                first_delivery.append(time.monotonic())
            super().__call__(df, batch_id)

    sink = StampedCollector()
    with TimedProducer(producer) as writer:
        wait_for(lambda: len(writer.calls) >= 3, timeout=30, what="the producer to run")
        existing = list(producer.sent)  # acknowledged before the query starts
        query = start_triggered(spark, options, tmp_path / "ck", sink, availableNow=True)
        try:
            assert query.awaitTermination(240), "Trigger.AvailableNow did not stop by itself"
            assert query.exception() is None
            still_writing = writer.alive
        finally:
            stop_quietly(query)
    assert writer.error is None, f"the producer failed: {writer.error!r}"
    assert still_writing, "the producer stopped before the query did"
    rows = sink.rows()
    got = {(r.shard_id, r.seq) for r in rows}
    assert len(got) == len(rows), "duplicated rows"
    # Everything that existed before the start was read ...
    assert {(p.shard_id, p.seq) for p in existing} <= got
    # ... and nothing put after the first batch was delivered (the target was fixed before).
    late = [p for began, puts in writer.calls if began > first_delivery[0] for p in puts]
    assert late, "the producer put nothing during the run: the test proves nothing"
    assert not got & {(p.shard_id, p.seq) for p in late}
    # What was read is, per shard, a gap-free prefix of the shard in sequence order.
    per_shard = defaultdict(list)
    for p in producer.sent:
        per_shard[p.shard_id].append(p.seq)
    for shard, seqs in per_shard.items():
        read = [r.seq for r in rows if r.shard_id == shard]
        assert read == sorted(seqs, key=seq_key)[: len(read)], f"{shard}: not a prefix"
    assert len(sink.deliveries) >= 5, "expected several batches under maxRecordsPerBatch=400"
    assert max(len(b) for _, b in sink.deliveries) <= 400
