"""The benchmark table generator: targets judged from a results file, the generated part of
docs/benchmarks.md replaced without touching the hand-written text. No timing is asserted."""

from __future__ import annotations

from benchmarks import report, report_perf
from benchmarks.common import summary

READERS = ("raw_boto3", "naive", "kinesis_ddb")


def _e2e_row(shards: int, size: int, raw_ratio: float, naive_ratio: float, cpu: float = 40.0) -> dict:
    """A row under quotas: kinesis-ddb's CPU per GiB ``cpu``, the raw loop's 50, the floor 10."""
    return {"shards": shards, "record_bytes": size, "records": 1000,
            "rps": {k: summary([100.0, 110.0, 90.0]) for k in READERS},
            "rps_with_query_start": {"kinesis_ddb": summary([50.0])},
            "ratio_vs_raw": raw_ratio, "ratio_vs_naive": naive_ratio, "quotas": True,
            "refused": {k: summary([0.0]) for k in READERS},
            "cpu_s_per_gib": {"raw_boto3": summary([50.0]), "naive": summary([80.0]),
                              "kinesis_ddb": summary([cpu])},
            "floor_cpu_s_per_gib": 10.0}


def _results(commit_calls: int, raw_ratio: float) -> dict:
    return {
        "command": ".venv/bin/python -m benchmarks",
        "date": "2026-01-01T00:00:00+00:00",
        "quick": False,
        "results_file": "benchmarks/results/2026-01-01.json",
        "machine": {"cores": 2, "memory_gib": 24, "platform": "Linux", "python": "3.11.7",
                    "java": "openjdk 17", "libraries": {"pyspark": "4.3.0"}},
        "e2e": [_e2e_row(4, 100, 1.2, 2.5), _e2e_row(8, 100, raw_ratio, 2.5, cpu=60.0),
                _e2e_row(8, 1024, 1.05, 3.0)],
        "commit": [{"shards": 1000, "calls": commit_calls, "seconds": summary([0.3, 0.4, 0.5])}],
        "memory": {"records": 1_000_000, "record_bytes": 100,
                   "growth_mib": summary([10.0, 12.0, 11.0]),
                   "rss_after_first_page_mib": summary([100.0]), "rss_peak_mib": summary([111.0]),
                   "records_per_second": summary([50_000.0])},
    }


def test_targets_are_judged_from_the_results() -> None:
    judged = {t["target"]: t for t in report.targets(_results(commit_calls=11, raw_ratio=0.85))}
    raw = judged["end to end under quotas, 4/8 shards vs raw boto3 loop"]
    assert raw["value"] == 0.85 and not raw["pass"]  # the worst row decides
    assert judged["end to end under quotas, 4/8 shards vs naive driver-side reader"]["pass"]
    cpu = judged["end to end under quotas, 4/8 shards: client CPU per GiB / raw boto3 loop's"]
    assert cpu["value"] == 60.0 / 50.0 and not cpu["pass"]  # the worst row decides
    assert "/ the json+base64 floor: 4.00x (4, 100 B), 6.00x (8, 100 B)" in cpu["shown"]
    assert not judged["commit of 1,000 shard positions"]["pass"]  # 11 calls > 10
    assert judged["executor RSS growth over a 1,000,000-record range"]["pass"]
    assert report.targets(_results(commit_calls=10, raw_ratio=1.0))[0]["pass"]
    unbudgeted = _results(commit_calls=10, raw_ratio=1.0)
    for row in unbudgeted["e2e"]:
        row["quotas"] = False  # the reference rows have no target
    assert not [t for t in report.targets(unbudgeted) if t["target"].startswith("end to end")]


def test_table_shows_each_target_and_its_provenance() -> None:
    results = _results(commit_calls=11, raw_ratio=0.85)
    text = report.render(results)
    assert "`.venv/bin/python -m benchmarks`" in text and "2 cores, 24 GiB" in text
    for t in report.targets(results):
        row = next(line for line in text.splitlines() if line.startswith(f"| {t['target']} |"))
        assert t["shown"] in row
        assert row.endswith("| pass |" if t["pass"] else "| **fail** |")


def test_update_doc_replaces_only_the_generated_part(tmp_path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# B\n\nintro\n\n{report.BEGIN}\nold table\n{report.END}\n\n## Notes\nkept\n")
    report.update_doc(doc, report.render(_results(commit_calls=11, raw_ratio=0.85)))
    text = doc.read_text()
    assert "old table" not in text and "intro" in text and "## Notes\nkept" in text
    assert text.count(report.BEGIN) == 1 and text.count(report.END) == 1


def test_canned_e2e_gets_its_own_table_and_targets() -> None:
    results = _results(commit_calls=10, raw_ratio=0.95)
    rows = [dict(r, ratio_vs_raw=1.1, ratio_vs_naive=1.5,
                 kinesis_ddb_phase_seconds={"addBatch": 2.0, "latestOffset": 0.5},
                 kinesis_ddb_batches=1.0,
                 kinesis_calls_last_turn={"raw_boto3": {"GetRecords": 16}})
            for r in results["e2e"]]
    results["e2e_canned"] = {"latency_ms": 20.0, "records": 1000, "rows": rows}
    judged = {t["target"]: t for t in report.targets(results)}
    canned = "end to end, canned Kinesis 20 ms per request under quotas, 4/8 shards"
    assert judged[f"{canned} vs raw boto3 loop"]["pass"]
    naive = judged[f"{canned} vs naive driver-side reader"]
    assert naive["value"] == 1.5 and not naive["pass"]
    assert not judged["end to end under quotas, 4/8 shards vs raw boto3 loop"]["pass"]  # the moto rows stay
    text = report.render(results)
    assert "End to end, moto server" in text
    assert "| 8 | 100 B | 1,000 |" in text
    assert "| 0, 0, 0 | 50.0 (0.0), 80.0 (0.0), 60.0 (0.0); 10.0 | 1.20 | 6.0 |" in text
    assert "End to end, canned Kinesis server, 20 ms per request" in text
    assert "raw_boto3 16 GetRecords" in text


def _tasks_run(backend: str | None, shards: int, batch_s: float, age_p95: float) -> dict:
    run = {"shards": shards, "active": shards // 10 if shards > 10 else shards, "shards_per_task": None,
           "batches": 50, "batch_seconds": summary([batch_s]), "add_batch_seconds": summary([batch_s / 2]),
           "latest_offset_seconds": summary([0.03]), "answer_seconds": summary([0.004]),
           "ranges_per_batch": summary([50.0]), "tasks_per_batch": 2,
           "end_age_seconds": summary([age_p95] * 20), "phase_seconds": {}}
    if backend is not None:
        run.update(backend=backend, server_cpu_cores=0.1, refused=0, peak_get_records_per_shard_s=1.2,
                   peak_get_shard_iterator_per_shard_s=0.1)
    return run


def test_batches_at_scale_are_judged_per_kinesis_server() -> None:
    results = _results(commit_calls=10, raw_ratio=0.95)
    results["tasks"] = {
        "latency_seconds": 0.02, "rate": 2, "measure_seconds": 60,
        "runs": [_tasks_run("moto", 10, 0.25, 1.0), _tasks_run("moto", 1000, 1.0, 2.7),
                 _tasks_run("canned", 10, 0.2, 1.0), _tasks_run("canned", 1000, 0.3, 1.1)],
        "ratios_1000_over_10": {"moto": 4.0, "canned": 1.5},
    }
    judged = {t["target"]: t for t in report.targets(results)}
    moto = "batch time, 1,000 shards (10% active) / 10 shards, 20 ms latency, on moto"
    canned = "batch time, 1,000 shards (10% active) / 10 shards, 20 ms latency, on the canned server and DynamoDB stub"
    assert judged[moto]["value"] == 4.0 and not judged[moto]["pass"]
    assert judged[canned]["value"] == 1.5 and judged[canned]["pass"]
    fresh = [t for name, t in judged.items() if name.startswith("freshness")]
    assert sorted(t["pass"] for t in fresh) == [False, True]
    text = report.render(results)
    assert "| canned | 1,000 | 100 | default |" in text and "| 1.2 / 0.1 | 0 |" in text
    # a results file from before the canned server: moto's ratio alone, no budget columns
    old = dict(results["tasks"], runs=[_tasks_run(None, 10, 0.25, 1.0), _tasks_run(None, 1000, 1.0, 2.7)])
    del old["ratios_1000_over_10"]
    old["ratio_1000_over_10"] = 4.0
    results["tasks"] = old
    assert [t["value"] for t in report.targets(results) if t["target"].startswith("batch time")] == [4.0]
    assert "| moto | 1,000 | 100 | default |" in report.render(results)


def _catch_up_run(backend: str | None, shards: int, ratio: float) -> dict:
    shard = {k: 1.0 for k in ("executor_ideal_s", "first_data_call_s", "first_executor_answer_s",
                              "first_executor_call_s", "limit_with_first_answer_s", "physical_s",
                              "query_ratio", "query_window_s", "ratio_with_first_answer", "read_window_s")}
    shard.update(shard="s-0", backlog_bytes=27_000_000)
    run = {"shards": shards, "worst_shard": "s-0", "per_shard": [shard], "read_ratio_worst": ratio,
           "read_ratio_median": ratio, "records_read": 10, "records_written": 10, "refused_source": 0,
           "refused_by_reason": {}, "query_seconds": 20.0}
    if backend is not None:
        run["backend"] = backend
    return run


def test_catch_up_is_judged_per_kinesis_server() -> None:
    results = _results(commit_calls=10, raw_ratio=0.95)
    neighbour = {"setting": "default", "record_bytes": 10_000, "neighbour_limit": 105, "run_seconds": 300.0,
                 "backlog_bytes": 1, "source_bytes_per_s": 1048576.0, "source_bytes_per_s_from_first": 1048576.0,
                 "source_refused": 0, "source_refused_by_reason": {}, "source_refused_per_minute": 0.0,
                 "source_refused_at": [], "neighbour_bytes_per_s": 1048576.0, "neighbour_calls": 300,
                 "neighbour_refused": 0, "neighbour_refused_by_reason": {}, "server_failures": []}
    cap = {"cap": "0.5MiB", "bytes_per_s": 0.49 * 1048576, "executor_bytes_per_s": 0.49 * 1048576,
           "refused_source": 0, "run_seconds": 40.0, "backlog_bytes": 1, "data_calls": 10, "span_seconds": 38.0}
    results["catchup"] = {"record_bytes": 1000, "skip_seconds": 10.0, "neighbour": [neighbour], "cap": cap,
                          "catch_up": [_catch_up_run("moto", 1, 0.89), _catch_up_run("canned", 1, 0.96)]}
    judged = {t["target"]: t for t in report.targets(results) if t["target"].startswith("catch-up (AvailableNow) on")}
    assert {name.split(",")[0]: t["pass"] for name, t in judged.items()} == {
        "catch-up (AvailableNow) on moto": False, "catch-up (AvailableNow) on the canned server": True}
    assert "| canned | 1 | 25.7 MiB |" in report.render(results)
    results["catchup"]["catch_up"] = [_catch_up_run(None, 1, 0.89)]  # before the canned runs: moto's
    assert [t["target"].split(",")[0] for t in report.targets(results) if "on moto" in t["target"]] == [
        "catch-up (AvailableNow) on moto"]


def _cpu_run(backend: str, shards: int, ours_cpu: float, rps: float, allowed: float) -> dict:
    shard = {"physical_s": 8.0}
    return {"backend": backend, "shards": shards, "records_written": 432_000, "refused_source": 0,
            "per_shard": [shard], "cpu_s_per_gib": ours_cpu, "floor_cpu_s_per_gib": 4.0,
            "raw_loop": {"cpu_s_per_gib": 20.0, "seconds": 9.0, "refused": 12},
            "cpu_bound": {"records_per_s": rps, "allowed_records_per_s": allowed, "client_cores": 0.7,
                          "cores_left": 1.8}}


def test_issue_51_rows_split_the_overhead_and_judge_cpu_and_the_machines_bound() -> None:
    """The per-batch row splits our batch time into the rate source's, the Python data source
    API's and ours (judged on ours); the catch-up's CPU per GiB is judged against the raw loop's
    on every run; the 16-shard canned run against the lower of the CPU's and the physical
    limit's records/s; the backlog from start() against physical + an empty query."""
    results = _results(commit_calls=10, raw_ratio=1.0)
    results["overhead"] = {"batch_time_ratio_vs_rate": 2.0, "floor_ratio": 1.1,
                           "kinesis_ddb_phase_seconds": {"triggerExecution": 0.2},
                           "rate_phase_seconds": {"triggerExecution": 0.1},
                           "python_floor_matched_phase_seconds": {"triggerExecution": 0.18}}
    catchup = {"catch_up": [_cpu_run("moto", 16, 18.0, 30_000.0, 100_000.0),
                            _cpu_run("canned", 16, 25.0, 50_000.0, 120_000.0)]}
    med = {"whole_s": 12.0, "first_record_s": 11.9, "refused": 0}
    results["backlog_start"] = [{"backend": "moto", "backlog_bytes": 30_000_000, "physical_s": 9.3,
                                 "empty_query_s": 1.3, "ratio": 12.0 / 10.6, "median": med}]
    judged = {t["target"]: t for t in report.targets(results)}

    def add(name: str, goal: str, value: float, shown: str, ok: bool) -> None:
        judged[name] = {"value": value, "shown": shown, "pass": ok}

    report_perf.catchup_targets(add, catchup)
    split = judged["per-batch overhead vs rate source: the Python data source API's share and ours"]
    assert split["value"] == 0.2 / 0.18 and split["pass"]
    assert "200 ms = rate source 100 ms + Python data source API +80 ms + ours +20 ms" in split["shown"]
    cpu = judged["catch-up (AvailableNow): client CPU per GiB / raw boto3 loop's, same backlog, both servers"]
    assert cpu["value"] == 25.0 / 20.0 and not cpu["pass"]  # the canned run is over
    bound = judged["catch-up, 16 shards on the canned server: records/s / what the machine allows (its CPU or "
                   "the physical limit, the lower)"]
    assert bound["value"] == 50_000.0 / 54_000.0 and bound["pass"]  # the physical limit is the lower
    start = next(t for t in report.targets(results) if t["target"].startswith("AvailableNow over a one-shard"))
    assert start["pass"] and "first record delivered at 11.9 s" in start["shown"]
    text = "\n".join(report_perf.catchup_section({"catchup": catchup}))
    assert "| canned | 16 | 25.0 | 20.0, 9.0 s, 12 | 4.0 | 1.25 | 6.2 |" in text
