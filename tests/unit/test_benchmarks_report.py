"""The benchmark table generator: targets judged from a results file, the generated part of
docs/benchmarks.md replaced without touching the hand-written text. No timing is asserted."""

from __future__ import annotations

from benchmarks import report
from benchmarks.common import summary


def _results(commit_calls: int, raw_ratio: float) -> dict:
    rps = {k: summary([100.0, 110.0, 90.0]) for k in ("raw_boto3", "naive", "kinesis_ddb")}
    return {
        "command": ".venv/bin/python -m benchmarks",
        "date": "2026-01-01T00:00:00+00:00",
        "quick": False,
        "results_file": "benchmarks/results/2026-01-01.json",
        "machine": {"cores": 2, "memory_gib": 24, "platform": "Linux", "python": "3.11.7",
                    "java": "openjdk 17", "libraries": {"pyspark": "4.3.0"}},
        "e2e": [
            {"shards": 8, "record_bytes": 100, "records": 1000, "rps": rps,
             "rps_with_query_start": {"kinesis_ddb": summary([50.0])},
             "ratio_vs_raw": raw_ratio, "ratio_vs_naive": 2.5},
            {"shards": 8, "record_bytes": 1024, "records": 1000, "rps": rps,
             "rps_with_query_start": {"kinesis_ddb": summary([50.0])},
             "ratio_vs_raw": 0.95, "ratio_vs_naive": 3.0},
        ],
        "commit": [{"shards": 1000, "calls": commit_calls, "seconds": summary([0.3, 0.4, 0.5])}],
        "memory": {"records": 1_000_000, "record_bytes": 100,
                   "growth_mib": summary([10.0, 12.0, 11.0]),
                   "rss_after_first_page_mib": summary([100.0]), "rss_peak_mib": summary([111.0]),
                   "records_per_second": summary([50_000.0])},
    }


def test_targets_are_judged_from_the_results() -> None:
    judged = {t["target"]: t for t in report.targets(_results(commit_calls=11, raw_ratio=0.85))}
    raw = judged["end to end vs raw boto3 loop, 8 shards"]
    assert raw["value"] == 0.85 and not raw["pass"]  # the worst record size decides
    assert judged["end to end vs naive driver-side reader, 8 shards"]["pass"]
    assert not judged["commit of 1,000 shard positions"]["pass"]  # 11 calls > 10
    assert judged["executor RSS growth over a 1,000,000-record range"]["pass"]
    assert report.targets(_results(commit_calls=10, raw_ratio=0.9))[2]["pass"]


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
    assert judged["end to end, canned Kinesis 20 ms per request vs raw boto3 loop, 8 shards"]["pass"]
    naive = judged["end to end, canned Kinesis 20 ms per request vs naive driver-side reader, 8 shards"]
    assert naive["value"] == 1.5 and not naive["pass"]
    assert judged["end to end vs raw boto3 loop, 8 shards"]["pass"]  # the moto rows stay
    text = report.render(results)
    assert "End to end, moto server" in text
    assert "End to end, canned Kinesis server, 20 ms per request" in text
    assert "raw_boto3 16 GetRecords" in text
