"""Scenario 11: resharding under kills (issue 19, item 2), on kinesis-local.

moto (5.2.5) cannot take part: its PutRecords routes a key to the first shard whose hash range
holds it, closed or not, so after a split every record still goes to the parent and no child is
ever written (the same reason ``tests/integration/test_resharding.py`` runs on kinesis-local).

The campaign of scenario 1 (driver SIGKILLs at seeded points, restarts alternating keep/drop of
the Spark checkpoint, the exactly-once sink) on a stream that reshards by itself all along:

- a thread splits and merges open shards at seeded moments (2 to 4 shards open), so kills land
  during probes, reads and commits of parents and children alike;
- after every aimed kill, one more reshard while the query is down;
- every third kill (the first included) is a *boundary* kill: the producer pauses, the query
  commits every shard's last record, the driver is killed, and a shard holding records is split
  while it is down. The restart's resume point for that parent is exactly its last record, with
  the Spark checkpoint kept (kills 0, 6, ...) and dropped (kills 3, 9, ...).

Counted: lost, invented, duplicated (only from the batch in flight), out of order per shard and
per partition key (a child's record before its parent's is one), all 0 but the duplicates.
"""

from __future__ import annotations

import pytest

from kinesis_source.errors import CheckpointError
from kinesis_source.positions import Position, ShardId
from tests.chaos import harness
from tests.chaos.campaign import run_campaign
from tests.chaos.harness import BackgroundProducer
from tests.chaos.resharder import Resharder
from tests.chaos.test_kills import assert_campaign
from tests.support.committed import stored, tips
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.backends("kinesis-local")]


def read_to_the_end(stream: str, table: dict[ShardId, Position], sent: list, open_ids: set[str]) -> bool:
    """Every shard written is committed at its last record: open shards exactly there; closed
    ones there, finished, or gone from the table (a finished shard whose children are
    committed leaves it)."""
    for shard, tip in tips(sent).items():
        got = table.get(ShardId(stream, shard))
        if shard in open_ids:
            if got != tip:
                return False
        elif got is not None and got != tip and not got.is_shard_end:
            return False
    return True


@pytest.mark.timeout(max(900, 300 + 200 * (harness.KILLS + 1)))
def test_driver_sigkills_while_resharding_lose_nothing_and_keep_key_order(
    kinesis, ddb, make_stream, source_options, tmp_path
):
    stream = make_stream(2)
    options = {**source_options, "streamName": stream, "maxRecordsPerFetch": "25",
               "shardDiscoveryIntervalMs": "500"}
    app = options["applicationName"]
    producer = BackgroundProducer(kinesis, stream, burst=20, interval=0.5)
    boundaries: list[dict] = []
    down: list[str] = []  # reshards while the query was down

    with Resharder(kinesis, stream, harness.rng_for("reshard")) as resharder:

        def settled(table, sent) -> bool:
            return read_to_the_end(stream, table, sent, {s["ShardId"] for s in resharder.open_shards()})

        def boundary(driver) -> bool:
            """Pause the producer and resharding until the query committed every last record;
            the campaign then kills the driver at once and ``between`` splits a shard."""
            resharder.hold()
            producer.pause()

            def committed_all() -> bool:
                driver.check_alive()
                try:
                    return settled(stored(ddb, app), producer.sent)
                except CheckpointError:  # the first run has not created the table yet
                    return False

            wait_for(committed_all, timeout=180, what=f"{driver.run} to commit every shard's last record")
            return True

        def between(i: int) -> None:
            if i in hooks:
                # the parent's last record is the committed position: split it while down
                try:
                    last = tips(producer.sent)
                    written = [s for s in resharder.open_shards() if s["ShardId"] in last]
                    parent = harness.rng_for(f"boundary-{i}").choice(written)
                    resharder.split(parent)
                    boundaries.append({"kill": i, "parent": parent["ShardId"],
                                       "resume_at": str(last[parent["ShardId"]]),
                                       "keeps_checkpoint": (i + 1) % 2 == 1})
                finally:
                    producer.resume()
                    resharder.release()
            else:
                # merges and splits in turn, so the bounded form has both while down
                down.append(resharder.reshard_once(prefer="merge" if len(down) % 2 == 0 else "split"))

        kills = harness.KILLS
        hooks = {i: boundary for i in range(0, kills, 3)}
        outcome = run_campaign(
            kinesis=kinesis, ddb=ddb, stream=stream, options=options, out=tmp_path, kills=kills,
            rng=harness.rng_for("sigkill-reshard"), hooks=hooks, between=between, settled=settled,
            producer=producer,
        )
        done = list(resharder.done)
        shards = resharder.shards()
    read = {shard for shard, figures in outcome.report.shards.items() if figures.delivered}
    children_read = [s["ShardId"] for s in shards if s.get("ParentShardId") and s["ShardId"] in read]
    harness.publish(
        "reshard-sigkill", backend="kinesis-local",
        reshards=len(done), splits=sum(1 for k, _ in done if k == "split"),
        merges=sum(1 for k, _ in done if k == "merge"), reshards_while_down=down,
        boundaries=boundaries, shards=len(shards), children_read=len(children_read), **outcome.figures(),
    )
    assert_campaign(outcome, harness.SEED)
    assert len(boundaries) == len(hooks) and len(down) == kills - len(hooks)
    assert any(k == "split" for k, _ in done) and any(k == "merge" for k, _ in done), done
    assert children_read, "no child shard was read: the reshards happened after the last record"
