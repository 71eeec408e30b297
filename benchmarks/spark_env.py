"""The Spark side of the benchmarks: one ``local[2]`` session with kinesis-ddb and the naive
baseline registered, and running a query to the ``noop`` sink until it has read a backlog."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

from benchmarks.common import local_env


def session(master: str = "local[2]") -> Any:
    """A SparkSession (``local[2]`` unless said) on loopback with kinesis-ddb and the baselines
    registered; executors of a ``local-cluster`` master get the environment they need."""
    local_env()
    from pyspark.sql import SparkSession

    from benchmarks.floor_source import FloorDataSource
    from benchmarks.naive import NaiveKinesisDataSource
    from kinesis_source import register

    builder = SparkSession.builder
    if master.startswith("local-cluster"):
        for key in ("PYTHONPATH", "PYSPARK_PYTHON", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
            if key in os.environ:
                builder = builder.config(f"spark.executorEnv.{key}", os.environ[key])
    spark = (
        builder.master(master)
        .appName("kinesis-ddb-benchmarks")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "2g")
        # the per-batch benchmark reads every batch's progress of a window
        .config("spark.sql.streaming.numRecentProgressUpdates", "2000")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("FATAL")  # query.stop() aborts tasks noisily
    register(spark)
    spark.dataSource.register(NaiveKinesisDataSource)
    spark.dataSource.register(FloorDataSource)
    return spark


def start(spark: Any, fmt: str, options: dict[str, str], checkpoint: str, once: bool = False) -> Any:
    """Start ``format(fmt)`` with ``options`` into the ``noop`` sink, triggers back to back
    (``once``: one batch, then the query stops)."""
    stream = spark.readStream.format(fmt)
    for key, value in options.items():
        stream = stream.option(key, value)
    writer = stream.load().writeStream.format("noop").option("checkpointLocation", checkpoint)
    writer = writer.trigger(once=True) if once else writer.trigger(processingTime="0 seconds")
    return writer.start()


def progress_dicts(query: Any) -> list[dict[str, Any]]:
    """The query's recent progress events as plain dicts."""
    return [json.loads(p.json) if hasattr(p, "json") else dict(p) for p in query.recentProgress]


def read_backlog(spark: Any, fmt: str, options: dict[str, str], expected: int,
                 timeout: float = 600.0) -> dict[str, Any]:
    """Run a query until it has read ``expected`` rows; its batches' time and the wall time.

    ``seconds`` adds up ``triggerExecution`` of the batches that read rows (planning, reading and
    writing them: what the query spends on the backlog, without starting the query);
    ``wall_seconds`` runs from ``start()`` to the last of those batches.
    """
    checkpoint = tempfile.mkdtemp(prefix="kddb-bench-")
    began = time.perf_counter()
    query = start(spark, fmt, options, checkpoint)
    try:
        while True:
            progress = progress_dicts(query)
            rows = sum(p["numInputRows"] for p in progress)
            if rows >= expected:
                break
            if not query.isActive:
                raise RuntimeError(f"{fmt} query stopped: {query.exception()}")
            if time.perf_counter() - began > timeout:
                raise TimeoutError(f"{fmt} query read {rows} of {expected} rows in {timeout} s")
            time.sleep(0.05)
        wall = time.perf_counter() - began
    finally:
        query.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)
    batches = [p for p in progress if p["numInputRows"] > 0]
    if rows != expected:
        raise AssertionError(f"{fmt} read {rows} rows, expected {expected}")
    phases: dict[str, float] = {}
    for p in batches:
        for phase, ms in p["durationMs"].items():
            phases[phase] = phases.get(phase, 0.0) + ms / 1000
    return {
        "rows": rows,
        "batches": len(batches),
        "seconds": phases.get("triggerExecution", 0.0),
        "wall_seconds": wall,
        "phases": phases,
    }


def tasks_for(spark: Any, shards: int) -> int:
    """How many tasks kinesis-ddb plans for a batch reading ``shards`` shards on this session
    (``shardsPerTask`` unset): the floor source's partitions for the same batch."""
    from kinesis_source.driver.tasks import group, shards_per_task

    per_task = shards_per_task(shards, None, spark.sparkContext.defaultParallelism)
    return len(group(list(range(shards)), per_task))


def one_batch(spark: Any, fmt: str, options: dict[str, str], timeout: float = 300.0) -> float:
    """Run a query of one batch (``Trigger.Once``), which must read rows; the seconds from
    ``start()`` to its end (what a Python source costs Spark for one batch, its query's start
    included, when ``fmt`` is the floor source)."""
    checkpoint = tempfile.mkdtemp(prefix="kddb-bench-")
    began = time.perf_counter()
    query = start(spark, fmt, options, checkpoint, once=True)
    try:
        if not query.awaitTermination(timeout):
            raise TimeoutError(f"{fmt} query's one batch not done in {timeout} s")
        if query.exception() is not None:
            raise RuntimeError(f"{fmt} query failed: {query.exception()}")
        if not any(p["numInputRows"] > 0 for p in progress_dicts(query)):
            raise AssertionError(f"{fmt} query's one batch read no row")
        return time.perf_counter() - began
    finally:
        query.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)


def suite_main(doc: str, run_suite: Callable[[Any, str, bool], Any]) -> None:
    """The command line of a Spark benchmark suite: ``--quick``; a local endpoint and a
    session for ``run_suite(spark, url, quick)``, whose results are printed as JSON."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    local_env()
    from kinesis_source.tools.local import LocalEndpoint

    with LocalEndpoint() as ep:
        spark = session()
        try:
            out = run_suite(spark, ep.url, args.quick)
        finally:
            spark.stop()
    print(json.dumps(out, indent=1, sort_keys=True))
