"""Scenarios 1, 2, 3 and 9: driver SIGKILLs at seeded random points, an executor Python worker
killed mid-read, the exactly-once recipe across the crashes, and both in Spark local-cluster."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.chaos import harness
from tests.chaos.campaign import assert_replayed_where_due, describe, run_campaign
from tests.chaos.driver import ChaosDriver
from tests.support.boto3_reads import read_range_boto3
from tests.support.checker import load_deliveries
from tests.support.quota import Neighbour, QuotaProxy, Quotas, as_users_run
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.backends(*harness.backends("moto"))]


def assert_campaign(outcome, seed):
    why = describe(outcome, seed)
    totals = outcome.report.totals()
    assert totals["lost"] == 0, f"records lost\n{why}"
    assert totals["invented"] == 0, f"records invented\n{why}"
    assert totals["out_of_order"] == 0, f"records out of order within a run\n{why}"
    assert outcome.out_of_key_order == 0, f"records out of their partition key's order within a run\n{why}"
    assert outcome.beyond_bound == [], f"{outcome.beyond_bound}\n{why}"
    assert outcome.mismatched_replays == [], f"{outcome.mismatched_replays}\n{why}"
    assert_replayed_where_due(outcome, why)
    assert outcome.sink_duplicates == 0 and outcome.sink_rows == outcome.sent, why
    # the exactly-once sink absorbed re-delivered rows (fewer than the raw duplicates when a kill
    # came between the raw file and the SQLite transaction: that batch reached SQLite once)
    assert outcome.sink_skipped <= totals["duplicated"], why


# ~45 s per driver run on a loaded 2-core machine: the suite's 600 s default is too short for
# the long form
@pytest.mark.timeout(max(600, 300 + 150 * (harness.KILLS + 1)))
def test_driver_sigkills_and_worker_kills_lose_nothing(kinesis, ddb, make_stream, source_options, tmp_path):
    """Scenarios 1, 2, 3 and 9 as one campaign (one JVM start per run keeps CI bounded).

    9: the first run uses Spark's local-cluster[2,1,1024] master (two executor JVMs) when the
    pip pyspark can launch it (it can here; see docs/reliability.md), the others local[2,4].
    Where it cannot, the campaign runs on local[2,4] alone and the test then reports itself
    skipped with the reason, after asserting scenarios 1 to 3 (a silent fallback hid it).
    2: in the first two runs (local-cluster, then local[2,4]) a Python worker SIGKILLs itself
    after sending the first page of a range; Spark's task retry must deliver exactly the planned
    range, as read independently with boto3.
    1: KDDB_CHAOS_KILLS driver SIGKILLs aimed in turn at planning, reading, committing (or the
    sink) and a random moment; restarts alternate between keeping and dropping the Spark
    checkpoint. 0 lost; rows read again only from the batch in flight, identical when replayed
    under the kept checkpoint. The query commits to DynamoDB at most every 2 s
    (``checkpointIntervalMs``): a restart that drops the Spark checkpoint reads again at most the
    rows DynamoDB did not hold.
    3: the exactly-once sink holds every record once."""
    stream = make_stream(4)
    # With a commit interval (issue 50): the other campaigns commit every batch, this one at
    # most every 2 s, so a restart from DynamoDB may start up to that far behind; the bound
    # below allows exactly the rows DynamoDB did not hold at the restart, never one it held.
    options = {**source_options, "streamName": stream, "maxRecordsPerFetch": "25",
               "checkpointIntervalMs": "2000"}
    why_not = local_cluster_usable()
    masters = {0: LOCAL_CLUSTER if why_not is None else "local[2,4]"}
    worker_kills: list[dict] = []

    def check_worker_kill(driver):
        figures = worker_kill_check(kinesis, tmp_path, driver, stream)
        worker_kills.append({"run": driver.run, "master": masters.get(int(driver.run[3:]), "local[2,4]"), **figures})

    hooks = {i: check_worker_kill for i in range(min(2, harness.KILLS))}
    for i in hooks:
        (tmp_path / f"killworker-run{i:02d}").write_text("")
    outcome = run_campaign(
        kinesis=kinesis, ddb=ddb, stream=stream, options=options, out=tmp_path,
        kills=harness.KILLS, rng=harness.rng_for("sigkill"), masters=masters, hooks=hooks,
    )
    for figures in worker_kills:
        harness.publish("worker-kill", **figures)
    harness.publish("driver-sigkill", local_cluster=why_not or "run00", **outcome.figures())
    assert len(worker_kills) == len(hooks)
    assert all(w["delivered_rows"] == w["range_rows"] > 0 for w in worker_kills), worker_kills
    assert_campaign(outcome, harness.SEED)
    if why_not is not None:
        # scenarios 1, 2 and 3 passed on local[2,4]; scenario 9 did not run: said, not hidden
        pytest.skip(f"scenario 9 (Spark {LOCAL_CLUSTER}) did not run, every run used local[2,4]: {why_not}")


@pytest.mark.skipif(not harness.LONG, reason="long form only: the bounded form's throttling storm "
                    "(test_throttling.py) kills drivers under throttling and also holds the budget")
@pytest.mark.timeout(max(600, 300 + 150 * (harness.KILLS + 1)))
def test_driver_sigkills_while_throttled_lose_nothing(
    kinesis, kinesis_backend, ddb, make_stream, source_options, tmp_path
):
    """Issue 16: the same kills on the quota-enforcing server, while the shards are throttled: a
    neighbour polls every shard 1.5 times a second against a GetRecords quota of 2 calls a
    second, so with this source's 2 (all of them executor reads, with tip reports) some calls are
    refused and retried. 0 lost; rows read again only
    from the batch in flight; the query never fails."""
    stream = make_stream(4)
    shards = [s["ShardId"] for s in kinesis.list_shards(StreamName=stream)["Shards"]]
    with QuotaProxy(kinesis_backend, Quotas(get_records_calls=2)) as quota, Neighbour(
        quota.url, stream, shards, rate=1.5
    ) as neighbour:
        options = as_users_run(source_options)
        options.update(streamName=stream, endpointUrl=quota.url)
        outcome = run_campaign(
            kinesis=kinesis, ddb=ddb, stream=stream, options=options, out=tmp_path,
            # the bounded form: two kills (one planning, one reading) keep CI's time in bounds
            kills=harness.KILLS if harness.LONG else min(harness.KILLS, 2), rng=harness.rng_for("sigkill-throttled"),
        )
    ours = quota.refused(where=lambda s: s.access_key == options["awsAccessKeyId"])
    harness.publish("driver-sigkill-throttled", throttled=ours, neighbour_refused=neighbour.refused,
                    **outcome.figures())
    assert ours > 0, "no call of the query was throttled: the scenario did not happen"
    assert_campaign(outcome, harness.SEED)


def worker_kill_check(kinesis, out: Path, driver: ChaosDriver, stream: str, timeout: float = 240):
    """Wait for the killed read's retry to be delivered; compare it with the planned range."""
    reads = out / f"{driver.run}.reads.jsonl"

    def killed_and_retried():
        driver.check_alive()
        if not reads.exists():
            return None
        entries = [json.loads(x) for x in reads.read_text().splitlines()]
        killed = [e for e in entries if e["kill"]]
        if not killed:
            return None
        k = killed[0]
        same = [e for e in entries if (e["shard"], e["start"], e["end_seq"]) == (k["shard"], k["start"], k["end_seq"])]
        retries = [e for e in same if e["pid"] != k["pid"] and e["attempt"] and e["attempt"] > k["attempt"]]
        if not retries:
            return None
        for d in load_deliveries(out / "deliveries", [driver.run]):
            if (k["shard"], k["end_seq"]) in d.rows:
                return k, retries, d
        return None

    killed, retries, delivery = wait_for(killed_and_retried, timeout=timeout, interval=0.5,
                                         what="the killed read to be retried and delivered")
    planned = [
        r["SequenceNumber"]
        for r in read_range_boto3(kinesis, stream, killed["shard"], killed["start"], killed["end_seq"])
    ]
    got = [seq for shard, seq in delivery.rows if shard == killed["shard"]]
    assert planned, "the killed range was empty"
    assert got == planned, (
        f"the retried partition delivered {len(got)} rows, the planned range "
        f"{killed['shard']} ({killed['start']} .. {killed['end_seq']}] holds {len(planned)}"
    )
    log = (out / f"{driver.run}.phases").read_text()
    assert "worker-killed" in log
    return {"range_rows": len(planned), "delivered_rows": len(got), "attempts": 1 + len(retries),
            "killed_pid": killed["pid"], "retry_pids": sorted({r["pid"] for r in retries})}


LOCAL_CLUSTER = "local-cluster[2,1,1024]"


def local_cluster_usable() -> str | None:
    """Why Spark's local-cluster mode cannot run here, or None if it can."""
    import pyspark

    home = Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent)
    for need in ("bin/spark-class", "bin/load-spark-env.sh", "jars"):
        if not (home / need).exists():
            return f"{home / need} is missing: local-cluster launches executors with it"
    return None
