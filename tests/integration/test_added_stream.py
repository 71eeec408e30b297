"""A stream added to an application that already ran (issue 14 item 7): it starts at option
'initialPosition', with a new Spark checkpoint and with the old one, and its identity is
recorded so a re-creation is detected."""

from __future__ import annotations

import pytest

from kinesis_source.checkpoints.store import CheckpointStore
from tests.support.committed import TABLE, wait_committed
from tests.support.producer import Producer
from tests.support.spark_query import running
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.backends("moto")]


def _first_run(spark, kinesis, make_stream, source_options, ddb, checkpoint):
    """Stream ``a`` read by an application; then ``b``, with 300 older records, is added."""
    a, b = make_stream(1), make_stream(2)
    options = {**source_options, "streamName": a, "initialPosition": "TRIM_HORIZON"}
    first = Producer(kinesis, a, tag="a").put(20)
    with running(spark, options, checkpoint) as (_, sink):
        wait_for(lambda: sink.count() >= 20, timeout=90, what="stream a's records")
        wait_committed(ddb, options["applicationName"], a, first)
    old = Producer(kinesis, b, tag="b-old").put(300)
    return a, b, old, {**options, "streamName": f"{a},{b}", "initialPosition": "LATEST"}


def _reads_only_what_comes_after(spark, kinesis, ddb, a, b, old, options, checkpoint):
    with running(spark, options, checkpoint) as (query, sink):
        wait_for(lambda: query.lastProgress is not None, timeout=90, what="the first trigger")
        new = Producer(kinesis, b, tag="b-new").put(30) + Producer(kinesis, a, tag="a-new").put(5)
        wait_for(lambda: sink.count() >= len(new), timeout=90, what="the new records")
        assert query.isActive
    got = sorted((r.stream, r.shard_id, r.seq) for r in sink.rows())
    want = sorted(((b if p.data.startswith(b"b") else a), p.shard_id, p.seq) for p in new)
    assert got == want, f"{len([g for g in got if g[0] == b]) - 30} of b's older records read"
    meta = CheckpointStore(ddb, TABLE, options["applicationName"]).snapshot().meta
    assert set(meta.streams) == {a, b}, "the added stream's identity was not recorded"
    return meta


def test_added_stream_with_a_new_spark_checkpoint_starts_at_initial_position(
    spark, kinesis, make_stream, source_options, ddb, tmp_path
):
    a, b, old, options = _first_run(spark, kinesis, make_stream, source_options, ddb, tmp_path / "ck1")
    meta = _reads_only_what_comes_after(spark, kinesis, ddb, a, b, old, options, tmp_path / "ck2")
    # stored with the other initial positions: the next start without a Spark checkpoint
    # finds them (after b's older records, not TRIM_HORIZON)
    b_shards = {k: p for k, p in meta.resolved.shards.items() if k.stream == b}
    assert len(b_shards) == 2 and all(p.kind == "AFTER" for p in b_shards.values()), b_shards


def test_added_stream_with_the_old_spark_checkpoint_starts_at_initial_position(
    spark, kinesis, make_stream, source_options, ddb, tmp_path
):
    a, b, old, options = _first_run(spark, kinesis, make_stream, source_options, ddb, tmp_path / "ck")
    _reads_only_what_comes_after(spark, kinesis, ddb, a, b, old, options, tmp_path / "ck")
