"""Batches at scale (issue 17): a 1,000-shard stream with 10% of its shards active against a
10-shard stream with all active, behind the quota-enforcing proxy with ``LATENCY_S`` injected in
every request (a region's round trip).

A Spark streaming query (default trigger and options but endpoints and credentials,
``initialPosition=LATEST``, ``noop`` sink) reads while ``RATE`` records a second arrive on each
active shard. From the first batch with records, for ``MEASURE_S``, the batches with records
give: the median and p95 batch time (``triggerExecution``) and its phases (``addBatch``: the
tasks that read; ``latestOffset``), and the ranges per batch (the source's
``executorReadsBooked`` and ``rangesCarried``); the proxy gives the refusals and the busiest shard's calls a second.
Each stream is read with the default grouping of shards into tasks (``shardsPerTask`` from the
session's parallelism) and, at 1,000 shards on moto, with one task per shard
(``shardsPerTask=1``, the layout before grouping); the canned server also serves 4,000 shards
(400 active), a size moto cannot serve on this machine.

Two Kinesis servers sit behind the proxy, each case in turn:

- ``moto``: a :class:`Feeder` writes the records with ``PutRecords``; DynamoDB is the same moto.
  One Python process answers every call on the two cores Spark uses too (4.3 ms of CPU per
  ``GetRecords``, and a ``TransactWriteItems`` that copies the table once per item), so at 1,000
  shards the batch time follows how busy moto is.
- ``canned``: :mod:`benchmarks.canned`'s live stream (records arrive by the clock, no writer)
  and :mod:`benchmarks.ddb_stub` for DynamoDB with the same latency: servers that take next to
  no CPU from the client's machine, as a remote service's do, so what scales is the source.

The acceptance ratio is, per server, the 1,000-shard batch time over the 10-shard one, grouped,
in one run.

Freshness (issue 17): for every shard a batch of the window moved, the age of its planned end's
arrival: the time ``latestOffset`` returned (the batch's start plus its ``latestOffset`` phase)
less the end record's arrival (on moto: the time of the ``PutRecords`` call that wrote it, so at
most the call's time older than the arrival itself; on the canned server: its arrival time).

    python -m benchmarks.tasks [--quick]
"""

from __future__ import annotations

import contextlib
import json
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import boto3
from botocore.config import Config

from benchmarks.canned import CannedKinesisServer, StreamSpec
from benchmarks.common import REGION, create_stream, p95, server_cpu_seconds, source_options, summary
from benchmarks.ddb_stub import DynamoStub
from benchmarks.overhead import _report, ranges_planned
from benchmarks.quota import Feeders, _shard_ids, _start, _wait
from kinesis_source.driver.tasks import shards_per_task
from tests.support.quota import QuotaProxy

LATENCY_S = 0.020
RATE = 2  # records per second per active shard
RECORD_BYTES = 100
FIRST_BATCH_TIMEOUT_S = 300.0
# backend, shards, active, shardsPerTask
CASES = (("moto", 10, 10, None), ("moto", 1000, 100, None), ("moto", 1000, 100, 1),
         ("canned", 10, 10, None), ("canned", 1000, 100, None), ("canned", 4000, 400, None))


def _progress(query: Any) -> list[dict[str, Any]]:
    return [json.loads(p.json) for p in query.recentProgress]


def measure(spark: Any, url: str, shards: int, active: int, per_task: int | None, measure_s: float,
            backend: str = "moto") -> dict[str, Any]:
    """One query on a new stream of ``shards`` shards, ``active`` of them fed: on moto (a
    :class:`Feeders` writes to it) or on the canned server's live stream (``backend="canned"``;
    its records arrive by the clock, no writer; DynamoDB then on the stub, with the same
    latency). DynamoDB is never behind the quota proxy: its quotas are Kinesis'."""
    checkpoint = tempfile.mkdtemp(prefix="kddb-tasks-")
    with contextlib.ExitStack() as stack:
        if backend == "canned":
            # enough records for the wait for the first batch, the window and some slack
            capacity = int(RATE * (FIRST_BATCH_TIMEOUT_S + measure_s + 120))
            spec = StreamSpec(f"tasks-{shards}-{uuid.uuid4().hex[:8]}", shards, capacity, RECORD_BYTES,
                              live_rate=RATE, fed_every=max(1, shards // active))
            server = stack.enter_context(CannedKinesisServer([spec]))
            kinesis_url, stream, marker = server.url, spec.name, "benchmarks.canned"
            ddb_url = stack.enter_context(DynamoStub(latency=LATENCY_S)).url
            feeding: Any = contextlib.nullcontext()
        else:
            client = boto3.client("kinesis", endpoint_url=url, region_name=REGION,
                                  config=Config(retries={"mode": "standard", "max_attempts": 10}))
            stream = create_stream(client, shards, "tasks")
            ids = _shard_ids(client, stream)
            kinesis_url, ddb_url, marker = url, url, "moto.server"
            feeding = Feeders(client, stream, ids[:: max(1, shards // active)][:active], RATE)
        quota = stack.enter_context(QuotaProxy(kinesis_url))
        quota.latency = LATENCY_S
        options = source_options(quota.url, stream, initialPosition="LATEST")
        options["dynamodbEndpointUrl"] = ddb_url  # not behind the proxy: its quotas are Kinesis'
        if per_task is not None:
            options["shardsPerTask"] = str(per_task)
        query = _start(spark, options, checkpoint)
        try:
            with feeding:
                _wait(lambda: any(p["numInputRows"] for p in _progress(query)), FIRST_BATCH_TIMEOUT_S,
                      "the first batch with records", query)
                began, began_mono, server_cpu = time.time(), time.monotonic(), server_cpu_seconds(marker)
                time.sleep(measure_s)  # the measured window: the query runs, nothing is awaited
                progress = _progress(query)
                server_busy = (server_cpu_seconds(marker) - server_cpu) / (time.time() - began)
                in_window = lambda seen: seen.at >= began_mono  # noqa: E731 - the proxy's clock
                budget = {"refused": quota.refused(in_window),
                          "peak_get_records_per_shard_s": quota.peak_rate("GetRecords", 10.0, since=began_mono),
                          "peak_get_shard_iterator_per_shard_s": quota.peak_rate(
                              "GetShardIterator", 10.0, since=began_mono)}
            if backend == "canned":
                def arrival(seq: str) -> float | None:
                    return spec.arrival(server.origin, seq)
            else:
                put_at = feeding.put_at()
                arrival = put_at.get
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
        # the planner's own answer (Spark's latestOffset phase adds the offsets' round trip)
        "answer_seconds": summary(_report(p).get("lastAnswerMs", 0) / 1000 for p in window),
        "phase_seconds": {
            phase: statistics.median(p["durationMs"].get(phase, 0) / 1000 for p in window)
            for phase in window[0]["durationMs"]
        } if window else {},
        "ranges_per_batch": summary(ranges) if ranges else None,
        "end_age_seconds": summary(ages) if (ages := _end_ages(window, arrival)) else None,
        "tasks_per_batch": tasks_planned,
        "backend": backend,
        # the quota proxy's count over the window: refusals, and the busiest shard's calls
        # a second in a 10 s window (driver and executors together)
        **budget,
        # the Kinesis server's CPU over the window (cores): one Python process (moto's also
        # serves DynamoDB)
        "server_cpu_cores": server_busy,
    }


def _epoch(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _end_ages(window: list[dict[str, Any]], arrival: Callable[[str], float | None]) -> list[float]:
    """Per batch and moved shard: when ``latestOffset`` returned less when its end arrived (on
    moto: when the ``PutRecords`` call that wrote it was made)."""
    ages = []
    for p in window:
        source = p["sources"][0]
        start, end = (json.loads(source[k]) if isinstance(source[k], str) else source[k]
                      for k in ("startOffset", "endOffset"))
        planned = _epoch(p["timestamp"]) + p["durationMs"].get("latestOffset", 0) / 1000
        for shard, position in end["shards"].items():
            if position != start["shards"].get(shard) and position.startswith("AFTER:"):
                seq = position.split(":")[1]
                if (arrived := arrival(seq)) is not None:
                    ages.append(planned - arrived)
    return ages


def _ranges_per_batch(progress: list[dict[str, Any]], since: float) -> list[int]:
    """Ranges read by each batch with records since ``since``: the growth of the ranges the
    source planned (reported with the batch's progress: read from Kinesis, and carried)."""
    out, last = [], None
    for p in progress:
        report = _report(p)
        if "executorReadsBooked" not in report:
            continue
        booked = ranges_planned(report)
        if last is not None and p["numInputRows"] > 0 and _epoch(p["timestamp"]) >= since:
            out.append(booked - last)
        last = booked
    return out


def run_suite(spark: Any, url: str, quick: bool) -> dict[str, Any]:
    """Every case, printed as it goes; per backend, the 1,000/10 ratio of the grouped batch times."""
    measure_s = 20.0 if quick else 60.0
    runs = []
    for backend, shards, active, per_task in CASES:
        r = measure(spark, url, shards, active, per_task, measure_s, backend)
        _print(r)
        runs.append(r)
    out: dict[str, Any] = {"latency_seconds": LATENCY_S, "rate": RATE, "measure_seconds": measure_s, "runs": runs}
    out["ratios_1000_over_10"] = {}
    for backend in dict.fromkeys(c[0] for c in CASES):
        grouped = {r["shards"]: r for r in runs if r["shards_per_task"] is None and r["backend"] == backend}
        if 10 in grouped and 1000 in grouped:
            out["ratios_1000_over_10"][backend] = (
                grouped[1000]["batch_seconds"]["median"] / grouped[10]["batch_seconds"]["median"])
    return out


def _print(r: dict[str, Any]) -> None:
    b, a, lo = r["batch_seconds"], r["add_batch_seconds"], r["latest_offset_seconds"]
    print(
        f"  tasks {r.get('backend', 'moto')} {r['shards']:>5} shards ({r['active']} active, shardsPerTask "
        f"{r['shards_per_task'] or 'default'}): {r['batches']} batches, batch "
        f"{b['median'] * 1000:.0f} ms (p95 {p95(b) * 1000:.0f}), addBatch {a['median'] * 1000:.0f} ms, "
        f"latestOffset {lo['median'] * 1000:.0f} ms (p95 {p95(lo) * 1000:.0f}; answer "
        f"{r['answer_seconds']['median'] * 1000:.1f} ms), ranges/batch "
        f"{r['ranges_per_batch']['median'] if r['ranges_per_batch'] else 0:.0f}, "
        f"tasks/batch {r['tasks_per_batch']:.0f}, server {r['server_cpu_cores']:.2f} cores, planned end's age "
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
