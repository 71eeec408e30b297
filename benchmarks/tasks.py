"""Batches at scale (issue 17): a 1,000-shard stream with 10% of its shards active against a
10-shard stream with all active, on moto behind the quota-enforcing proxy with ``LATENCY_S``
injected in every request (a region's round trip).

A Spark streaming query (default trigger and options but endpoints and credentials,
``initialPosition=LATEST``, ``noop`` sink) reads while a :class:`Feeder` writes ``RATE``
records a second to each active shard. From the first batch with records, for ``MEASURE_S``,
the batches with records give: the median and p95 batch time (``triggerExecution``) and its
phases (``addBatch``: the tasks that read; ``latestOffset``), and the ranges per batch (the
source's ``executorReadsBooked``). Each stream is read with the default grouping of shards into
tasks (``shardsPerTask`` from the session's parallelism) and, at 1,000 shards, with one task
per shard (``shardsPerTask=1``, the layout before grouping).

The acceptance ratio is the 1,000-shard batch time over the 10-shard one, grouped, in one run.

Freshness (issue 17): for every shard a batch of the window moved, the age of its planned end's
arrival: the time ``latestOffset`` returned (the batch's start plus its ``latestOffset`` phase)
less the time of the ``PutRecords`` call that wrote the end record (so at most the call's time
older than the arrival itself).

    python -m benchmarks.tasks [--quick]
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from typing import Any

import boto3
from botocore.config import Config

from benchmarks.common import REGION, create_stream, p95, server_cpu_seconds, source_options, summary
from benchmarks.overhead import _report
from benchmarks.quota import Feeders, _shard_ids, _start, _wait
from kinesis_source.driver.tasks import shards_per_task
from tests.support.quota import QuotaProxy

LATENCY_S = 0.020
RATE = 2  # records per second per active shard
FIRST_BATCH_TIMEOUT_S = 300.0
CASES = ((10, 10, None), (1000, 100, None), (1000, 100, 1))  # shards, active, shardsPerTask


def _progress(query: Any) -> list[dict[str, Any]]:
    return [json.loads(p.json) for p in query.recentProgress]


def measure(spark: Any, url: str, shards: int, active: int, per_task: int | None, measure_s: float) -> dict[str, Any]:
    """One query on a new stream of ``shards`` shards, ``active`` of them fed."""
    client = boto3.client("kinesis", endpoint_url=url, region_name=REGION,
                          config=Config(retries={"mode": "standard", "max_attempts": 10}))
    stream = create_stream(client, shards, "tasks")
    ids = _shard_ids(client, stream)
    fed = ids[:: max(1, shards // active)][:active]
    checkpoint = tempfile.mkdtemp(prefix="kddb-tasks-")
    with QuotaProxy(url) as quota:
        quota.latency = LATENCY_S
        options = source_options(quota.url, stream, initialPosition="LATEST")
        options["dynamodbEndpointUrl"] = url  # DynamoDB straight to moto: the proxy is Kinesis'
        if per_task is not None:
            options["shardsPerTask"] = str(per_task)
        query = _start(spark, options, checkpoint)
        try:
            with Feeders(client, stream, fed, RATE) as feeders:
                _wait(lambda: any(p["numInputRows"] for p in _progress(query)), FIRST_BATCH_TIMEOUT_S,
                      "the first batch with records", query)
                began, moto_cpu = time.time(), server_cpu_seconds()
                time.sleep(measure_s)  # the measured window: the query runs, nothing is awaited
                progress = _progress(query)
                moto_busy = (server_cpu_seconds() - moto_cpu) / (time.time() - began)
            put_at = feeders.put_at()
        finally:
            query.stop()
            shutil.rmtree(checkpoint, ignore_errors=True)
    window = [p for p in progress
              if p["numInputRows"] > 0 and _epoch(p["timestamp"]) >= began]
    ranges = _ranges_per_batch(progress, began)
    tasks_planned = statistics.median(
        -(-r // shards_per_task(r, per_task, spark.sparkContext.defaultParallelism)) for r in ranges
    ) if ranges else 0
    return {
        "shards": shards,
        "active": active,
        "shards_per_task": per_task,
        "batches": len(window),
        "rows": sum(p["numInputRows"] for p in window),
        "batch_seconds": summary(p["durationMs"]["triggerExecution"] / 1000 for p in window),
        "add_batch_seconds": summary(p["durationMs"].get("addBatch", 0) / 1000 for p in window),
        "latest_offset_seconds": summary(p["durationMs"].get("latestOffset", 0) / 1000 for p in window),
        # the planner's own answer (Spark's latestOffset adds the DynamoDB commit beside it)
        "answer_seconds": summary(_report(p).get("lastAnswerMs", 0) / 1000 for p in window),
        "phase_seconds": {
            phase: statistics.median(p["durationMs"].get(phase, 0) / 1000 for p in window)
            for phase in window[0]["durationMs"]
        } if window else {},
        "ranges_per_batch": summary(ranges) if ranges else None,
        "end_age_seconds": summary(ages) if (ages := _end_ages(window, put_at)) else None,
        "tasks_per_batch": tasks_planned,
        # moto's CPU over the window (cores): one Python process serves every call of the run
        "moto_cpu_cores": moto_busy,
    }


def _epoch(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _end_ages(window: list[dict[str, Any]], put_at: dict[str, float]) -> list[float]:
    """Per batch and moved shard: when ``latestOffset`` returned less when its end was put."""
    ages = []
    for p in window:
        source = p["sources"][0]
        start, end = (json.loads(source[k]) if isinstance(source[k], str) else source[k]
                      for k in ("startOffset", "endOffset"))
        planned = _epoch(p["timestamp"]) + p["durationMs"].get("latestOffset", 0) / 1000
        for shard, position in end["shards"].items():
            if position != start["shards"].get(shard) and position.startswith("AFTER:"):
                seq = position.split(":")[1]
                if seq in put_at:
                    ages.append(planned - put_at[seq])
    return ages


def _ranges_per_batch(progress: list[dict[str, Any]], since: float) -> list[int]:
    """Ranges read by each batch with records since ``since``: the growth of the source's
    ``executorReadsBooked`` (reported with the batch's progress)."""
    out, last = [], None
    for p in progress:
        booked = _report(p).get("executorReadsBooked")
        if booked is None:
            continue
        if last is not None and p["numInputRows"] > 0 and _epoch(p["timestamp"]) >= since:
            out.append(booked - last)
        last = booked
    return out


def run_suite(spark: Any, url: str, quick: bool) -> dict[str, Any]:
    """Every case, printed as it goes; the 1,000/10 ratio of the grouped batch times."""
    measure_s = 20.0 if quick else 60.0
    runs = []
    for shards, active, per_task in CASES:
        r = measure(spark, url, shards, active, per_task, measure_s)
        _print(r)
        runs.append(r)
    grouped = {r["shards"]: r for r in runs if r["shards_per_task"] is None}
    out: dict[str, Any] = {"latency_seconds": LATENCY_S, "rate": RATE, "measure_seconds": measure_s, "runs": runs}
    if 10 in grouped and 1000 in grouped:
        out["ratio_1000_over_10"] = (
            grouped[1000]["batch_seconds"]["median"] / grouped[10]["batch_seconds"]["median"])
    return out


def _print(r: dict[str, Any]) -> None:
    b, a, lo = r["batch_seconds"], r["add_batch_seconds"], r["latest_offset_seconds"]
    print(
        f"  tasks {r['shards']:>5} shards ({r['active']} active, shardsPerTask "
        f"{r['shards_per_task'] or 'default'}): {r['batches']} batches, batch "
        f"{b['median'] * 1000:.0f} ms (p95 {p95(b) * 1000:.0f}), addBatch {a['median'] * 1000:.0f} ms, "
        f"latestOffset {lo['median'] * 1000:.0f} ms (p95 {p95(lo) * 1000:.0f}; answer "
        f"{r['answer_seconds']['median'] * 1000:.1f} ms), ranges/batch "
        f"{r['ranges_per_batch']['median'] if r['ranges_per_batch'] else 0:.0f}, "
        f"tasks/batch {r['tasks_per_batch']:.0f}, moto {r['moto_cpu_cores']:.2f} cores, planned end's age "
        + (f"p50 {r['end_age_seconds']['median']:.2f} s p95 {p95(r['end_age_seconds']):.2f} s"
           if r["end_age_seconds"] else "-"),
        flush=True,
    )
    print("    phases (median s): " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(r["phase_seconds"].items())))


def main() -> None:
    """Command-line entry point."""
    from benchmarks import spark_env

    spark_env.suite_main(__doc__, run_suite)


if __name__ == "__main__":
    main()
