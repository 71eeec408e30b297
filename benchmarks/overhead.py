"""Per-batch overhead: micro-batches per second when each batch holds almost nothing, kinesis-ddb
vs Spark's built-in ``rate-micro-batch`` source, with the same trigger (back to back) and sink
(``noop``).

kinesis-ddb runs no batch for an idle stream, so a producer puts one record per shard every
10 ms (during both sources' runs alike). The rate source gets the same number of partitions as
the stream has shards and a few rows per batch. We also run ``benchmarks/floor_source.py``, a
Python source that does no I/O at all (the floor of the Python Data Source API). We count batches
with rows over a window after a warm-up, and take the median duration of a batch
(``triggerExecution``) and of its phases (``durationMs``, which say where the time goes).

The overhead ratios are our median batch time over the rate source's and over the floor's. With
triggers back to back and new data at every trigger that is the other source's batches/s over
ours (the figure published before the tip table); kinesis-ddb's batches are now also paced by
its per-shard call budget (a shard's tip moves at most once per ``minProbeIntervalMs``, executor
reads are booked), so its batches/s counts batches that find no new tip too, and the batch time
is the per-batch cost. Both are reported. A kinesis-ddb batch reads a range only for the shards
whose tip moved (the source's ``executorReadsBooked`` and ``rangesCarried`` count them), so the floor also runs with
as many partitions as our batches had in the same turn (on average: a fractional count alternates
between the two whole numbers around it): the floor target compares with that run.

kinesis-ddb runs on two servers in each turn: moto (its one process serves every read, write and
DynamoDB call on the two cores Spark uses: about 10 ms of CPU per ``GetRecords``), and the
canned server's live stream (:mod:`benchmarks.canned`, the same record rate, answering after
``CANNED_LATENCY_S`` without the client's CPU) with :mod:`benchmarks.ddb_stub` for DynamoDB (the
same latency), as AWS's servers would.

    python -m benchmarks.overhead [--quick]
"""

from __future__ import annotations

import contextlib
import json
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from benchmarks import spark_env
from benchmarks.canned import CannedKinesisServer, StreamSpec
from benchmarks.common import (
    create_stream,
    describe,
    settings,
    shard_hash_keys,
    source_options,
    summary,
)

SHARDS = 4
PRODUCER_INTERVAL_S = 0.010
WARMUP_BATCHES = 3
CANNED_LATENCY_S = 0.020  # per request, Kinesis and DynamoDB: a region's round trip
CANNED_RECORD_BYTES = 40  # about the producer's records


class Producer:
    """Puts one small record per shard every ``PRODUCER_INTERVAL_S`` in a background thread."""

    def __init__(self, url: str, stream: str) -> None:
        self._client = settings(url).boto3_client("kinesis")
        self._stream = stream
        self._keys = shard_hash_keys(self._client, stream)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._client.put_records(
                StreamName=self._stream,
                Records=[
                    {"Data": b"x" * 100, "PartitionKey": "k", "ExplicitHashKey": h}
                    for _, h in self._keys
                ],
            )
            self._stop.wait(PRODUCER_INTERVAL_S)

    def __enter__(self) -> Producer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def batches_per_second(spark: Any, fmt: str, options: dict[str, str], window: float) -> dict[str, Any]:
    """Batches/s of a query over ``window`` seconds after its first batches, and the median
    phases of those batches."""
    checkpoint = tempfile.mkdtemp(prefix="kddb-bench-")
    query = spark_env.start(spark, fmt, options, checkpoint)
    try:
        deadline = time.monotonic() + 180
        while len(spark_env.progress_dicts(query)) < WARMUP_BATCHES:
            if not query.isActive or time.monotonic() > deadline:
                raise RuntimeError(f"{fmt} query made no progress: {query.exception()}")
            time.sleep(0.05)
        first = len(spark_env.progress_dicts(query))
        time.sleep(window)
        progress = spark_env.progress_dicts(query)
    finally:
        query.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)
    # Batches with rows (Spark also reports a trigger without data now and then).
    batches = [p for p in progress[first:] if p["numInputRows"] > 0]
    phases = {
        k: statistics.median(p["durationMs"].get(k, 0) for p in batches) / 1000
        for k in batches[0]["durationMs"]
    } if batches else {}
    out = {
        "batches_per_second": len(batches) / window,
        "rows_per_batch": statistics.median(p["numInputRows"] for p in batches) if batches else 0,
        "phase_seconds": phases,
    }
    if fmt == "kinesis-ddb" and batches:
        # Ranges read per batch (reportLatestOffset): those read from Kinesis and those carried.
        ranges = [ranges_planned(_report(p)) for p in progress[first - 1:]]
        out["ranges_per_batch"] = (ranges[-1] - ranges[0]) / len(batches)
    return out


def ranges_planned(report: dict[str, Any]) -> int:
    """Ranges the source handed to executors so far, by its report: those an executor read from
    Kinesis (``executorReadsBooked``) and those whose records the partition carried."""
    return report.get("executorReadsBooked", 0) + report.get("rangesCarried", 0)


def _report(progress: dict[str, Any]) -> dict[str, Any]:
    """The source's ``reportLatestOffset()`` of one progress event."""
    value = progress["sources"][0].get("latestOffset") or {}
    return json.loads(value) if isinstance(value, str) else value


@contextlib.contextmanager
def _canned(window: float, repeats: int) -> Iterator[dict[str, str]]:
    """kinesis-ddb's options on the canned server's live stream (a record per shard every
    ``PRODUCER_INTERVAL_S``, enough for every turn) and the DynamoDB stub."""
    from benchmarks.ddb_stub import DynamoStub

    per_shard = int((repeats * (window + 120) + 300) / PRODUCER_INTERVAL_S)
    spec = StreamSpec(f"overhead-{uuid.uuid4().hex[:8]}", SHARDS, per_shard, CANNED_RECORD_BYTES,
                      live_rate=1 / PRODUCER_INTERVAL_S)
    with CannedKinesisServer([spec], latency=CANNED_LATENCY_S) as server, \
            DynamoStub(latency=CANNED_LATENCY_S) as ddb:
        yield source_options(server.url, spec.name, dynamodbEndpointUrl=ddb.url, initialPosition="LATEST")


def _matched_floor(spark: Any, ours: dict[str, Any], window: float) -> dict[str, Any]:
    """The floor with as many partitions as ``ours``'s batches read ranges, on average."""
    parts = round(max(1.0, ours.get("ranges_per_batch", SHARDS)), 2)
    return {**batches_per_second(spark, "python-floor", {"numPartitions": str(parts)}, window), "partitions": parts}


def _on_server(ours: list[dict[str, Any]], matched: list[dict[str, Any]]) -> dict[str, Any]:
    """kinesis-ddb's figures on one server, and the floor's that matched them."""
    out = {
        "kinesis_ddb_bps": summary(r["batches_per_second"] for r in ours),
        "kinesis_ddb_phase_seconds": _median_phases(ours),
        "kinesis_ddb_ranges_per_batch": statistics.median(x.get("ranges_per_batch", 0.0) for x in ours),
        "python_floor_matched_bps": summary(x["batches_per_second"] for x in matched),
        "python_floor_matched_partitions": [x["partitions"] for x in matched],
        "python_floor_matched_phase_seconds": _median_phases(matched),
    }
    out["floor_ratio"] = (out["kinesis_ddb_phase_seconds"].get("triggerExecution", 0.0)
                          / out["python_floor_matched_phase_seconds"]["triggerExecution"])
    return out


def run_suite(spark: Any, url: str, quick: bool) -> dict[str, Any]:
    """Both sources, ``repeats`` windows each, alternating; kinesis-ddb on moto and on the
    canned server."""
    window, repeats = (5.0, 3) if quick else (15.0, 3)
    kinesis = settings(url).boto3_client("kinesis")
    stream = create_stream(kinesis, SHARDS, "overhead")
    rate_opts = {"rowsPerBatch": str(SHARDS), "numPartitions": str(SHARDS)}
    ours_opts = source_options(url, stream, checkpointTable="kinesis-ddb-bench-overhead",
                               initialPosition="LATEST")
    floor_opts = {"numPartitions": str(SHARDS)}
    ours, rate, floor, matched, canned, canned_matched = [], [], [], [], [], []
    with Producer(url, stream), _canned(window, repeats) as canned_opts:
        for turn in range(repeats):
            app = {"applicationName": f"{ours_opts['applicationName']}-{turn}"}
            ours.append(batches_per_second(spark, "kinesis-ddb", {**ours_opts, **app}, window))
            rate.append(batches_per_second(spark, "rate-micro-batch", rate_opts, window))
            floor.append(batches_per_second(spark, "python-floor", floor_opts, window))
            matched.append(_matched_floor(spark, ours[-1], window))
            app = {"applicationName": f"{canned_opts['applicationName']}-{turn}"}
            canned.append(batches_per_second(spark, "kinesis-ddb", {**canned_opts, **app}, window))
            canned_matched.append(_matched_floor(spark, canned[-1], window))
    moto = _on_server(ours, matched)
    o, m = moto["kinesis_ddb_bps"], moto["python_floor_matched_bps"]
    r = summary(x["batches_per_second"] for x in rate)
    f = summary(x["batches_per_second"] for x in floor)
    result = {
        "window_seconds": window,
        "shards": SHARDS,
        "rate_bps": r,
        "python_floor_bps": f,
        "kinesis_ddb_rows_per_batch": statistics.median(x["rows_per_batch"] for x in ours),
        "rate_phase_seconds": _median_phases(rate),
        "python_floor_phase_seconds": _median_phases(floor),
        **moto,
        "overhead_ratio": r["median"] / o["median"],
        "floor_bps_ratio": f["median"] / o["median"],
    }
    ours_t = result["kinesis_ddb_phase_seconds"].get("triggerExecution", 0.0)
    result["batch_time_ratio_vs_rate"] = ours_t / result["rate_phase_seconds"]["triggerExecution"]
    result["floor_ratio_same_partitions_as_shards"] = ours_t / result["python_floor_phase_seconds"]["triggerExecution"]
    result["canned"] = {**_on_server(canned, canned_matched), "latency_seconds": CANNED_LATENCY_S}
    print(
        f"  per-batch: kinesis-ddb {describe(o, ' batches/s', 2)} "
        f"({result['kinesis_ddb_ranges_per_batch']:.1f} ranges per batch); rate-micro-batch "
        f"{describe(r, ' batches/s', 2)}; python-floor {describe(f, ' batches/s', 2)}, with "
        f"{result['python_floor_matched_partitions']} partitions {describe(m, ' batches/s', 2)}; "
        f"median batch time x{result['batch_time_ratio_vs_rate']:.2f} the rate source's, "
        f"x{result['floor_ratio']:.2f} the floor's with as many partitions "
        f"(x{result['floor_ratio_same_partitions_as_shards']:.2f} with {SHARDS}); our phases "
        + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in result["kinesis_ddb_phase_seconds"].items()),
        flush=True,
    )
    c = result["canned"]
    print(
        f"  per-batch on the canned server ({CANNED_LATENCY_S * 1000:.0f} ms) and the DynamoDB stub: kinesis-ddb "
        f"{describe(c['kinesis_ddb_bps'], ' batches/s', 2)} ({c['kinesis_ddb_ranges_per_batch']:.1f} ranges per "
        f"batch); python-floor with {c['python_floor_matched_partitions']} partitions "
        f"{describe(c['python_floor_matched_bps'], ' batches/s', 2)}; median batch time x{c['floor_ratio']:.2f} "
        "the floor's; our phases "
        + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in c["kinesis_ddb_phase_seconds"].items()),
        flush=True,
    )
    return result


def _median_phases(runs: list[dict[str, Any]]) -> dict[str, float]:
    keys = runs[0]["phase_seconds"].keys()
    return {k: statistics.median(r["phase_seconds"].get(k, 0.0) for r in runs) for k in keys}


def main() -> None:
    """Command-line entry point."""
    from benchmarks import spark_env

    spark_env.suite_main(__doc__, run_suite)


if __name__ == "__main__":
    main()
