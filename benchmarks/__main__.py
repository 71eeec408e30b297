"""Run every benchmark, write ``benchmarks/results/<date>.json`` and the generated part of
``docs/benchmarks.md``.

    .venv/bin/python -m benchmarks [--quick] [--only <suite>,...]

(suites: read_path, kpl, commit, planning, memory, e2e, e2e_canned, overhead, quota, tasks,
overread, catchup, backlog_start, latency, latency_cluster, sink, cost)

``--quick`` runs smoke sizes (a minute or few, to check the suite works); without it the sizes are
those published. One moto server and one Spark session serve the whole run (``e2e_canned`` starts
its own canned Kinesis server and keeps only DynamoDB on moto; ``quota`` puts a quota-enforcing
proxy in front of moto's Kinesis, as do ``e2e``, ``e2e_canned``, ``tasks``, ``overread``,
``catchup``, ``backlog_start`` and ``sink``).

A run's results file holds what that run measured, nothing else: ``<date>[-quick].json``, or
``<date>[-quick]-<suite>+<suite>.json`` for ``--only``. The doc's generated part shows a full-size
``--only`` run merged with the earlier full-size results files (each suite from the newest file
that has it, each with its command, date and file); a smoke run shows only itself.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import (
    backlog_start,
    catchup,
    commit,
    cost,
    e2e,
    kpl,
    latency,
    memory,
    overhead,
    overread,
    planning,
    quota,
    read_path,
    report,
    report_cost,
    sink,
    tasks,
)
from benchmarks.common import local_env, machine

ROOT = Path(__file__).resolve().parent.parent
SUITES = report.SUITES
WATCHDOG_S = 900


def _run(name: str, fn: Callable[[], Any], results: dict[str, Any]) -> None:
    print(f"== {name}", flush=True)
    began = time.perf_counter()
    # A suite stuck for long prints every thread's stack (to stderr), then goes on waiting.
    faulthandler.dump_traceback_later(WATCHDOG_S, repeat=True)
    load = os.getloadavg()[0]
    results[name] = fn()
    faulthandler.cancel_dump_traceback_later()
    results["suite_seconds"][name] = round(time.perf_counter() - began, 1)
    # The machine is shared: the 1-minute load average at the suite's start and end.
    results.setdefault("load_average", {})[name] = [round(load, 2), round(os.getloadavg()[0], 2)]


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke sizes")
    parser.add_argument("--only", help="comma-separated suites: " + ",".join(SUITES))
    parser.add_argument("--no-doc", action="store_true", help="leave docs/benchmarks.md alone")
    args = parser.parse_args(argv)
    only = set(args.only.split(",")) if args.only else set(SUITES)
    unknown = only - set(SUITES)
    if unknown:
        parser.error(f"unknown suites: {', '.join(sorted(unknown))}")
    local_env()
    now = datetime.datetime.now(datetime.timezone.utc)
    stamp = now.strftime("%Y-%m-%d") + ("-quick" if args.quick else "")
    if args.only:
        stamp += "-" + "+".join(s for s in SUITES if s in only)
    out_file = ROOT / "benchmarks" / "results" / f"{stamp}.json"
    results: dict[str, Any] = {
        "date": now.isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python -m benchmarks", *(argv if argv is not None else sys.argv[1:])]),
        "quick": args.quick,
        "machine": machine(),
        "results_file": str(out_file.relative_to(ROOT)),
        "suite_seconds": {},
    }
    q = args.quick
    if "read_path" in only:
        _run("read_path", lambda: read_path.run_suite(q), results)
    if "kpl" in only:
        _run("kpl", lambda: kpl.run_suite(q), results)
    if "memory" in only:
        _run("memory", lambda: memory.run_suite(q), results)
    spark_suites = {"e2e", "e2e_canned", "overhead", "quota", "tasks", "overread", "catchup", "backlog_start",
                    "latency", "sink"}
    if only & ({"commit", "cost", "planning", "latency_cluster"} | spark_suites):
        from kinesis_source.tools.local import LocalEndpoint

        with LocalEndpoint() as ep:
            if "commit" in only:
                _run("commit", lambda: commit.run_suite(ep.url, q), results)
            if "cost" in only:
                _run("cost", lambda: cost.run_suite(ep.url, q), results)
            if "planning" in only:
                _run("planning", lambda: planning.run_suite(ep.url, q), results)
            if only & spark_suites:
                from benchmarks import spark_env

                spark = spark_env.session()
                try:
                    if "e2e" in only:
                        _run("e2e", lambda: e2e.run_suite(spark, ep.url, q), results)
                    if "e2e_canned" in only:
                        _run("e2e_canned", lambda: e2e.run_canned_suite(spark, ep.url, q), results)
                    if "overhead" in only:
                        _run("overhead", lambda: overhead.run_suite(spark, ep.url, q), results)
                    if "quota" in only:
                        _run("quota", lambda: quota.run_suite(spark, ep.url, q), results)
                    if "tasks" in only:
                        _run("tasks", lambda: tasks.run_suite(spark, ep.url, q), results)
                    if "overread" in only:
                        _run("overread", lambda: overread.run_suite(spark, ep.url, q), results)
                    if "catchup" in only:
                        _run("catchup", lambda: catchup.run_suite(spark, ep.url, q), results)
                    if "backlog_start" in only:
                        _run("backlog_start", lambda: backlog_start.run_suite(spark, ep.url, q), results)
                    if "latency" in only:
                        _run("latency", lambda: latency.run_suite(spark, ep.url, q), results)
                    if "sink" in only:
                        _run("sink", lambda: sink.run_suite(spark, ep.url, q), results)
                finally:
                    spark.stop()
            if "latency_cluster" in only:
                from benchmarks import spark_env

                spark = spark_env.session(latency.CLUSTER_MASTER)
                try:
                    _run("latency_cluster", lambda: latency.run_cluster_suite(spark, ep.url, q), results)
                finally:
                    spark.stop()
    results["targets"] = report.targets(results)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print(f"== wrote {out_file.relative_to(ROOT)}")
    for t in results["targets"]:
        print(f"  {'PASS' if t['pass'] else 'FAIL'}  {t['target']} {t['goal']}: {t['shown']}")
    if not args.no_doc:
        shown = results
        if args.only and not args.quick:
            shown = report.merge([*_earlier_full_runs(out_file), results])
        report.update_doc(ROOT / "docs" / "benchmarks.md", report.render(shown))
        report_cost.update_operations(ROOT / "docs" / "operations.md", shown)
        print("== updated docs/benchmarks.md")


def _earlier_full_runs(out_file: Path) -> list[dict[str, Any]]:
    """The full-size results files other than ``out_file``, oldest first."""
    runs = []
    for path in sorted(out_file.parent.glob("*.json")):
        if path == out_file:
            continue
        run = json.loads(path.read_text())
        if not run.get("quick"):
            runs.append(run)
    return sorted(runs, key=lambda r: r["date"])


if __name__ == "__main__":
    main()
