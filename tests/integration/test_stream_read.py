"""The exact-range reader end to end: real Spark local[2], real moto server over HTTP."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from datetime import datetime, timezone

import pytest

from kinesis_source.positions import seq_key
from tests.support.checker import per_shard
from tests.support.producer import Producer
from tests.support.spark_query import (
    Collector,
    commits_logged,
    failure_of,
    offsets_logged,
    probes_of,
    running,
    source_report,
    start_query,
    stop_quietly,
)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.spark


def assert_exactly_once_in_order(rows, sent):
    """Every sent record arrived once, and each shard's rows are in increasing sequence order."""
    got = [(r.shard_id, r.seq, r.data) for r in rows]
    want = [(p.shard_id, p.seq, p.data) for p in sent]
    dupes = len(got) - len(set(got))
    assert dupes == 0, f"{dupes} duplicated rows"
    assert sorted(got) == sorted(want), (
        f"missing {len(set(want) - set(got))}, unexpected {len(set(got) - set(want))}"
    )
    per_shard = defaultdict(list)
    for r in rows:
        per_shard[r.shard_id].append(seq_key(r.seq))
    for shard, seqs in per_shard.items():
        assert seqs == sorted(seqs), f"{shard} rows out of sequence order"


def test_multi_shard_stream_every_record_once_in_order(
    spark, kinesis, make_stream, source_options, tmp_path
):
    stream = make_stream(4)
    producer = Producer(kinesis, stream)
    producer.put(300)
    sink = Collector()
    query = start_query(spark, {**source_options, "streamName": stream}, tmp_path / "ck", sink)
    try:
        for _ in range(5):  # more rounds while the query runs
            wait_for(lambda: sink.count() >= len(producer.sent), timeout=90, what="round read")
            producer.put(340, burst=85)
        wait_for(lambda: sink.count() >= 2000, timeout=90, what="2,000 rows")
        assert len(producer.sent) == 2000
        assert_exactly_once_in_order(sink.rows(), producer.sent)
        assert len({r.shard_id for r in sink.rows()}) == 4
        assert {r.stream for r in sink.rows()} == {stream}
        batch_ids = [bid for bid, _ in sink.deliveries]
        assert batch_ids == sorted(batch_ids) and len(batch_ids) == len(set(batch_ids))
    finally:
        stop_quietly(query)


def test_shards_grouped_into_tasks_every_record_once_each_shard_in_order(
    spark, kinesis, make_stream, source_options, tmp_path
):
    """``shardsPerTask=3`` over 4 shards: each batch's ranges are read by ceil(ranges / 3) tasks
    (seen as Spark partitions), a task reads its shards at once, and still every record arrives
    once, each shard's in order."""
    from pyspark.sql.functions import spark_partition_id

    from tests.support.spark_query import Row, start_triggered

    stream = make_stream(4)
    producer = Producer(kinesis, stream)
    producer.put(400)
    seen: list[tuple[int, int, Row]] = []

    def sink(df, batch_id):
        for r in df.withColumn("task", spark_partition_id()).collect():
            row = Row(r["shardId"], r["sequenceNumber"], bytes(r["data"]), r["streamName"])
            seen.append((batch_id, r["task"], row))

    options = {**source_options, "streamName": stream, "shardsPerTask": "3"}
    query = start_triggered(spark, options, tmp_path / "ck", sink, processingTime="200 milliseconds")
    try:
        for _ in range(3):
            wait_for(lambda: len(seen) >= len(producer.sent), timeout=90, what="round read")
            producer.put(200, burst=50)
        wait_for(lambda: len(seen) >= 1000, timeout=90, what="1,000 rows")
        assert_exactly_once_in_order([row for _, _, row in seen], producer.sent)
        by_batch: dict[int, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
        for batch, task, row in seen:
            by_batch[batch][task].add(row.shard_id)
        for batch, tasks in by_batch.items():
            shards = set().union(*tasks.values())
            assert len(tasks) == -(-len(shards) // 3), f"batch {batch}: {dict(tasks)}"
            assert sum(map(len, tasks.values())) == len(shards), "a shard read by two tasks"
        assert any(len(s) > 1 for tasks in by_batch.values() for s in tasks.values()), "no task read two shards"
    finally:
        stop_quietly(query)


def test_replayed_batch_reads_exactly_the_same_rows(
    spark, kinesis, make_stream, source_options, tmp_path
):
    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    producer.put(200)
    ck = tmp_path / "ck"
    options = {**source_options, "streamName": stream}
    first = Collector(fail_batches={1})
    query = start_query(spark, options, ck, first)
    try:
        wait_for(lambda: first.count() >= 200, timeout=90, what="batch 0")
        producer.put(100)
        wait_for(lambda: first.batches(1), timeout=90, what="batch 1 delivered")
        wait_for(lambda: not query.isActive, timeout=60, what="query to fail on batch 1")
    finally:
        stop_quietly(query)
    # Batch 1 is planned (offsets/1) but not committed (no commits/1): a restart replays it.
    assert 1 in offsets_logged(ck) and 1 not in commits_logged(ck)
    failed_rows = first.batches(1)[0]
    # Shards are probed one by one, so the put can land between two probes and batch 1 may
    # hold only part of it; the rest must then come after the replay, never inside it.
    assert 0 < len(failed_rows) <= 100

    producer.put(150)  # a re-planned batch 1 would now include these
    second = Collector()
    query = start_query(spark, options, ck, second)
    try:
        wait_for(lambda: second.count() >= 250, timeout=90, what="replay and new data")
    finally:
        stop_quietly(query)
    assert second.deliveries[0][0] == 1, "the restart must begin by replaying batch 1"
    replays = second.batches(1)
    assert len(replays) == 1 and per_shard(replays[0]) == per_shard(failed_rows), (
        "replayed batch 1 differs from its first run")
    committed = first.batches(0)[0] + failed_rows + [
        r for bid, rows in second.deliveries if bid > 1 for r in rows
    ]
    assert_exactly_once_in_order(committed, producer.sent)


def test_idle_stream_runs_no_batches(spark, kinesis, make_stream, source_options, tmp_path):
    stream = make_stream(2)
    Producer(kinesis, stream).put(50)
    ck = tmp_path / "ck"
    sink = Collector()
    query = start_query(spark, {**source_options, "streamName": stream}, ck, sink, trigger_ms=100)
    try:
        wait_for(lambda: sink.count() >= 50, timeout=90, what="the 50 records")
        deliveries, offsets = len(sink.deliveries), offsets_logged(ck)

        start_probes = probes_of(query)
        # Several trigger intervals, each with a real probe of the idle stream.
        wait_for(lambda: probes_of(query) >= start_probes + 5, timeout=60, what="5 more probes")
        assert len(sink.deliveries) == deliveries, "an idle stream ran a batch"
        assert offsets_logged(ck) == offsets, "an idle stream logged a new offset"
        assert query.lastProgress["numInputRows"] == 0
    finally:
        stop_quietly(query)


def test_initial_position_latest_skips_earlier_records(
    spark, kinesis, make_stream, source_options, tmp_path
):
    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    old = producer.put(120)
    sink = Collector()
    options = {**source_options, "streamName": stream, "initialPosition": "LATEST"}
    query = start_query(spark, options, tmp_path / "ck", sink)
    try:
        # The first progress means initialOffset was resolved.
        wait_for(lambda: query.lastProgress is not None, timeout=90, what="first trigger")
        new = producer.put(60)
        wait_for(lambda: sink.count() >= 60, timeout=90, what="the new records")
        assert_exactly_once_in_order(sink.rows(), new)
        assert not {r.data for r in sink.rows()} & {p.data for p in old}
    finally:
        stop_quietly(query)


def test_initial_position_at_timestamp_starts_at_the_right_record(
    spark, kinesis, make_stream, source_options, tmp_path
):
    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    before = producer.put(80)
    newest = max(_arrivals(kinesis, stream))
    cut = newest + 0.002
    wait_for(lambda: time.time() > cut + 0.01, timeout=5, what="the clock to pass the cut")
    after = producer.put(70)
    assert min(_arrivals(kinesis, stream, skip=len(before))) > cut
    iso = datetime.fromtimestamp(cut, tz=timezone.utc).isoformat()
    options = {**source_options, "streamName": stream, "initialPosition": f"AT_TIMESTAMP:{iso}"}
    with running(spark, options, tmp_path / "ck") as (_, sink):
        wait_for(lambda: sink.count() >= 70, timeout=90, what="the records after the cut")
    assert_exactly_once_in_order(sink.rows(), after)


def test_initial_position_json_starts_after_given_sequence_numbers(
    spark, kinesis, make_stream, source_options, tmp_path
):
    stream = make_stream(3)
    producer = Producer(kinesis, stream)
    sent = producer.put(150)
    by_shard = defaultdict(list)
    for p in sent:
        by_shard[p.shard_id].append(p)
    shards = sorted(by_shard)
    named = {shards[0]: by_shard[shards[0]][9].seq, shards[1]: by_shard[shards[1]][0].seq}
    expected = [p for p in by_shard[shards[0]][10:]] + by_shard[shards[1]][1:] + by_shard[shards[2]]
    options = {**source_options, "streamName": stream, "initialPosition": json.dumps(named)}
    with running(spark, options, tmp_path / "ck") as (_, sink):
        wait_for(lambda: sink.count() >= len(expected), timeout=90, what="records after the cut")
    assert_exactly_once_in_order(sink.rows(), expected)


def test_tail_probe_fetches_a_small_fraction_of_the_batch(
    spark, kinesis, make_stream, source_options, tmp_path
):
    stream = make_stream(4)
    producer = Producer(kinesis, stream)
    producer.put(10_000, burst=100)
    # The probe reads what arrived in the last few milliseconds before each tip (5 ms, then
    # 40 if that was empty); on a fast server that could hold several of the bursts above. A
    # pause longer than both, then one last record per shard, makes each tip's neighbourhood
    # the same on every machine (this builds the scenario; it waits for nothing).
    time.sleep(0.1)
    for shard in kinesis.list_shards(StreamName=stream)["Shards"]:
        producer.put(1, hash_key=shard["HashKeyRange"]["StartingHashKey"])
    total = len(producer.sent)
    sink = Collector()
    query = start_query(spark, {**source_options, "streamName": stream}, tmp_path / "ck", sink)
    try:
        wait_for(lambda: sink.count() >= total, timeout=180, what="the 10,004-record backlog")
        first = wait_for(
            lambda: next((p for p in query.recentProgress if p["numInputRows"] > 0), None),
            timeout=30,
            what="the batch's progress event",
        )
    finally:
        stop_quietly(query)
    assert first["numInputRows"] == total, "the backlog should be one batch"
    fetched = source_report(first)["driverRecordsFetched"]
    # Planning read a few records per shard near each tip, not the backlog.
    assert 0 < fetched <= 0.02 * total, f"driver fetched {fetched} records to plan {total}"
    assert_exactly_once_in_order(sink.rows(), producer.sent)


def test_missing_stream_fails_the_query_naming_it(spark, source_options, tmp_path):
    message = failure_of(spark, {**source_options, "streamName": "no-such-stream"}, tmp_path / "ck")
    assert "Kinesis stream 'no-such-stream' was not found" in message
    assert "streamName" in message


def test_bad_option_fails_at_load_naming_it(spark, source_options):
    from pyspark.errors import PySparkException

    with pytest.raises(PySparkException) as err:
        (
            spark.readStream.format("kinesis-ddb")
            .options(**source_options)
            .option("streamName", "s")
            .option("maxRecordsPerFetch", "0")
            .load()
        )
    assert "Option 'maxRecordsPerFetch' = '0' is invalid: must be an integer from 1 to 10000" in str(
        err.value
    )


def _arrivals(kinesis, stream, skip=0):
    """Arrival timestamps (epoch seconds) of every record, read from the server."""
    out = []
    for shard in kinesis.list_shards(StreamName=stream)["Shards"]:
        it = kinesis.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        records = kinesis.get_records(ShardIterator=it)["Records"]
        out.extend(r["ApproximateArrivalTimestamp"].timestamp() for r in records)
    return sorted(out)[skip:]


def test_several_streams_in_one_query_are_kept_apart(
    spark, kinesis, ddb, make_stream, source_options, tmp_path
):
    from tests.support.committed import wait_committed

    one, two = make_stream(2), make_stream(1)
    first, second = Producer(kinesis, one, tag="one"), Producer(kinesis, two, tag="two")
    first.put(120)
    second.put(80)
    options = {**source_options, "streamName": f"{one},{two}"}
    with running(spark, options, tmp_path / "ck") as (_, sink):
        wait_for(lambda: sink.count() >= 200, timeout=90, what="both streams' records")
        first.put(30)
        wait_for(lambda: sink.count() >= 230, timeout=90, what="the new records")
        wait_committed(ddb, options["applicationName"], one, first.sent)
        wait_committed(ddb, options["applicationName"], two, second.sent)
    # sequence numbers may repeat across streams (moto): the stream column keeps them apart
    got = [(r.stream, r.shard_id, r.seq, r.data) for r in sink.rows()]
    want = [(one, p.shard_id, p.seq, p.data) for p in first.sent]
    want += [(two, p.shard_id, p.seq, p.data) for p in second.sent]
    assert len(got) == len(set(got)) and sorted(got) == sorted(want)
