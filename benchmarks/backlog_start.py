"""A backlog read from the query's start (issue 51 item 4): what a user who starts a
``Trigger.AvailableNow`` query over a backlog waits for, from ``start()`` to the end.

One shard holding ``RECORDS`` records of 1,000 bytes (28.6 MiB) behind the quota-enforcing proxy
of ``benchmarks/catchup.py`` (5 ``GetRecords`` a second, 2 MiB/s from a 10 MiB bucket per shard),
read by a query with default options into ``noop``. Its physical limit is the time Kinesis needs
to serve it: (backlog - 10 MiB) / 2 MiB/s = 9.3 s. Spark's own start is measured in the same run
as an empty query: the same options over a shard with no record (``Trigger.AvailableNow`` ends at
once), after a warm-up one. Figures, from ``start()`` (median of ``REPEATS`` runs each):

- the whole query, to ``awaitTermination``'s return, against physical + the empty query's time;
- the first record delivered: the end of the first batch with rows (its trigger's start plus
  ``triggerExecution``, from the progress report), when the sink holds it;
- the driver's first call, the last driver call before the executors' first, the executors' first
  and last data calls (the proxy's clock): what came before the reading.

On moto (written with ``PutRecords`` once, read by a new application each run) and on the canned
server (:mod:`benchmarks.canned`, the backlog there when it starts).

    python -m benchmarks.backlog_start [--quick]
"""

from __future__ import annotations

import contextlib
import datetime
import json
import statistics
import time
from typing import Any

from benchmarks.canned import CannedKinesisServer, StreamSpec
from benchmarks.catchup import (
    BURST_BYTES,
    RECORD_BYTES,
    SHARD_BYTES_PER_S,
    SOURCE_KEY,
    MeteredProxy,
    _fill,
    _options,
    _query,
    _stream,
)

RECORDS, QUICK_RECORDS = 30_000, 16_000  # 28.6 MiB, 15.3 MiB of 1,000-byte records
REPEATS, QUICK_REPEATS = 3, 1
TIMEOUT_S = 300.0


def _run(spark: Any, kinesis_url: str, ddb_url: str, stream: str, shard: str) -> dict[str, Any]:
    """One AvailableNow query over ``stream`` through a new proxy; times from its ``start()``."""
    with MeteredProxy(kinesis_url) as proxy:
        began, wall = time.monotonic(), time.time()
        with _query(spark, _options(proxy, ddb_url, stream), available_now=True) as query:
            if not query.awaitTermination(TIMEOUT_S):
                raise TimeoutError(f"AvailableNow over {stream}: not done in {TIMEOUT_S:.0f} s")
            if query.exception() is not None:
                raise RuntimeError(f"the query failed: {query.exception()}")
            whole = time.monotonic() - began
            progress = [json.loads(p.json) for p in query.recentProgress]
        calls = proxy.calls("GetRecords", where=lambda s: s.access_key == SOURCE_KEY)
        data = proxy.data_calls(SOURCE_KEY, shard)
        refused = proxy.refusal_counts(SOURCE_KEY)
    execs = [c.at - began for c in calls if c.client == "sync"]
    driver = [c.at - began for c in calls if c.client != "sync"]
    first = next((p for p in progress if p["numInputRows"] > 0), None)
    delivered = None
    if first is not None:
        at = datetime.datetime.fromisoformat(first["timestamp"].replace("Z", "+00:00")).timestamp()
        delivered = at + first["durationMs"]["triggerExecution"] / 1000 - wall
    return {
        "whole_s": whole,
        "first_record_s": delivered,
        "rows": sum(p["numInputRows"] for p in progress),
        "batches": sum(1 for p in progress if p["numInputRows"] > 0),
        "first_driver_call_s": min(driver) if driver else None,
        "driver_calls_before_read": sum(1 for t in driver if not execs or t < min(execs)),
        "last_driver_call_before_read_s": max((t for t in driver if not execs or t < min(execs)), default=None),
        "first_executor_call_s": min(execs) if execs else None,
        "last_data_call_s": data[-1].call.at - began if data else None,
        "bytes": sum(a.bytes for a in data),
        "refused": refused["total"],
    }


def measure(spark: Any, url: str, backend: str, records: int, repeats: int) -> dict[str, Any]:
    """The empty query and the backlog's, ``repeats`` times each, on ``backend``."""
    with contextlib.ExitStack() as stack:
        if backend == "canned":
            full = StreamSpec("backlog-start-full", 1, records, RECORD_BYTES)
            empty = StreamSpec("backlog-start-empty", 1, 0, RECORD_BYTES)
            server = stack.enter_context(CannedKinesisServer([full, empty]))
            kinesis_url, shard, backlog = server.url, full.shard_ids()[0], full.shard_bytes()
            full_name, empty_name = full.name, empty.name
        else:
            client, full_name, keys = _stream(url, 1, "backlog-start")
            _, empty_name, _ = _stream(url, 1, "backlog-empty")
            kinesis_url, shard = url, keys[0][0]
            backlog = _fill(client, full_name, keys, records)[shard]
        _run(spark, kinesis_url, url, empty_name, shard)  # warm-up: Spark's planning of this query
        empties, fulls = [], []
        for _ in range(repeats):
            empties.append(_run(spark, kinesis_url, url, empty_name, shard)["whole_s"])
            fulls.append(_run(spark, kinesis_url, url, full_name, shard))
    physical = max(0.0, backlog - BURST_BYTES) / SHARD_BYTES_PER_S
    empty_s = statistics.median(empties)
    median = {k: statistics.median(r[k] for r in fulls) for k in fulls[0]
              if all(isinstance(r[k], (int, float)) for r in fulls)}
    return {
        "backend": backend,
        "records": records,
        "backlog_bytes": backlog,
        "physical_s": physical,
        "empty_query_s": empty_s,
        "empty_query_runs_s": empties,
        "bound_s": physical + empty_s,
        "ratio": median["whole_s"] / (physical + empty_s),
        "median": median,
        "runs": fulls,
    }


def run_suite(spark: Any, url: str, quick: bool) -> list[dict[str, Any]]:
    """Moto and the canned server, printed as they finish."""
    out = []
    for backend in ("moto", "canned"):
        r = measure(spark, url, backend, QUICK_RECORDS if quick else RECORDS, QUICK_REPEATS if quick else REPEATS)
        m = r["median"]
        print(f"  backlog from start ({backend}): {r['backlog_bytes'] / 2**20:.1f} MiB, whole "
              f"{m['whole_s']:.2f} s vs physical {r['physical_s']:.2f} + empty query {r['empty_query_s']:.2f} s "
              f"= {r['ratio']:.2f}x; first record {m['first_record_s']:.2f} s; driver's first call "
              f"{m['first_driver_call_s']:.2f} s, executors' {m['first_executor_call_s']:.2f} s; "
              f"refused {m['refused']:g}", flush=True)
        out.append(r)
    return out


def main() -> None:
    """Command-line entry point."""
    from benchmarks import spark_env

    spark_env.suite_main(__doc__, run_suite)


if __name__ == "__main__":
    main()
