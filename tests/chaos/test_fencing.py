"""Scenario 6: two queries with one applicationName started 1 s apart: exactly one survives,
stored positions never regress, and the survivor reads every record."""

from __future__ import annotations

import time

import pytest

from kinesis_source.positions import ShardId
from tests.chaos import harness
from tests.chaos.harness import BackgroundProducer
from tests.support.checker import Delivery, check
from tests.support.committed import stored, tips
from tests.support.regression import RegressionWatch
from tests.support.spark_query import Collector, start_query, stop_quietly
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.backends(*harness.backends("moto"))]


@pytest.mark.parametrize("round_", range(harness.FENCING_ROUNDS))
def test_two_queries_one_application_exactly_one_survives(
    round_, spark, kinesis, ddb, make_stream, source_options, tmp_path
):
    stream = make_stream(2)
    options = {**source_options, "streamName": stream}
    app = options["applicationName"]
    producer = BackgroundProducer(kinesis, stream, burst=20, interval=0.2).start()
    watch = RegressionWatch(ddb, app)
    sinks = [Collector(), Collector()]
    queries = []
    try:
        queries.append(start_query(spark, options, tmp_path / "ck0", sinks[0]))
        time.sleep(1.0)  # the scenario: the second query starts 1 s after the first
        queries.append(start_query(spark, options, tmp_path / "ck1", sinks[1]))
        wait_for(lambda: sum(q.isActive for q in queries) < 2, timeout=240,
                 what="one of the two queries to be fenced")
        loser = next(i for i, q in enumerate(queries) if not q.isActive)
        winner = 1 - loser
        # the survivor goes on reading what arrives after the fencing
        mark = producer.count()
        def both():
            return {(r.shard_id, r.seq) for s in sinks for r in s.rows()}

        wait_for(lambda: queries[winner].isActive and both() >= {(p.shard_id, p.seq) for p in producer.sent[:mark]},
                 timeout=240, what="every record put so far to be read")
        sent = producer.stop()
        want = {ShardId(stream, sh): pos for sh, pos in tips(sent).items()}
        wait_for(lambda: queries[winner].isActive and stored(ddb, app) == want, timeout=240,
                 what="the survivor to commit every shard's tip")
        survivors = [q.isActive for q in queries]
        message = str(queries[loser].exception())
    finally:
        producer.stop() if producer.error is None else None
        watch.stop()
        for q in queries:
            stop_quietly(q)
    assert survivors.count(True) == 1, survivors
    assert "was claimed by another query" in message and f"application '{app}'" in message, message
    assert watch.regressions == [] and watch.observations > 10
    report = check(((p.shard_id, p.seq) for p in sent),
                   [Delivery(f"q{i}", 0, tuple((r.shard_id, r.seq) for r in s.rows())) for i, s in enumerate(sinks)])
    winner_only = check(((p.shard_id, p.seq) for p in sent),
                        [Delivery("w", 0, tuple((r.shard_id, r.seq) for r in sinks[winner].rows()))])
    # the two may both read records before the fencing (at-least-once), the survivor each once
    assert report.total("lost") == 0, report.table()
    assert winner_only.total("duplicated") == 0 and winner_only.total("out_of_order") == 0
    assert report.total("invented") == 0
    harness.publish("fencing", round=round_, survivor=f"started {'first' if winner == 0 else 'second'}",
                    records=len(sent), lost=report.total("lost"),
                    duplicated_across_both=report.total("duplicated"), regressions=len(watch.regressions))
