"""The targets and the generated tables of ``docs/benchmarks.md``, from a results JSON.

``python -m benchmarks.report benchmarks/results/<date>.json`` rewrites the generated part of
``docs/benchmarks.md`` (between ``BEGIN``/``END`` markers) from that file; ``python -m benchmarks``
does the same after a run. The text around the markers is written by hand.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

BEGIN = "<!-- BEGIN GENERATED: python -m benchmarks.report -->"
END = "<!-- END GENERATED -->"
MB_PER_MIB = 1.048576


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of the issue with its measured value and pass/fail (missing suites skipped)."""
    out = []

    def add(name: str, goal: str, value: float, shown: str, ok: bool) -> None:
        out.append({"target": name, "goal": goal, "value": value, "shown": shown, "pass": ok})

    _e2e_targets(add, res.get("e2e", []), "end to end")
    canned = res.get("e2e_canned")
    if canned:
        _e2e_targets(add, canned["rows"], f"end to end, canned Kinesis {_ms(canned)}")
    plan = res.get("planning")
    if plan:
        pct = plan["sustained"]["new_data"]["probe_pct_of_batch"]
        add("probe bytes / batch bytes (sustained batch)", "<= 2%", pct, f"{pct:.2f}%", pct <= 2.0)
        new, idle = plan["ratio_1000_over_10_new_data"], plan["ratio_1000_over_10_idle"]
        add("latestOffset time, 1,000 / 10 shards", "<= 3x", max(new, idle),
            f"{new:.1f}x with new data, {idle:.1f}x idle", max(new, idle) <= 3.0)
    commits = {r["shards"]: r for r in res.get("commit", [])}
    if 1000 in commits:
        c = commits[1000]
        secs = c["seconds"]["median"]
        shown = f"{c['calls']} call(s), {secs:.3f} s (client side)"
        if "moto_seconds" in c:
            secs = max(secs, c["moto_seconds"]["median"])
            shown += f", {c['moto_seconds']['median']:.3f} s on moto"
        add("commit of 1,000 shard positions", "<= 10 calls and <= 1 s", c["calls"],
            shown, c["calls"] <= 10 and secs <= 1.0)
    over = res.get("overhead")
    if over:
        ratio = over["overhead_ratio"]
        add("per-batch overhead vs rate source", "<= 1.5x", ratio, f"{ratio:.2f}x", ratio <= 1.5)
    mem = res.get("memory")
    if mem:
        mb = mem["growth_mib"]["median"] * MB_PER_MIB
        add(f"executor RSS growth over a {mem['records']:,}-record range", "<= 100 MB", mb,
            f"{mb:.1f} MB", mb <= 100.0)
    return out


def _e2e_targets(add: Any, rows: list[dict[str, Any]], label: str) -> None:
    """The two end-to-end targets (vs the raw loop, vs the naive reader) at 8 shards; the worst
    record size decides."""
    e2e8 = [r for r in rows if r["shards"] == 8]
    if not e2e8:
        return
    worst = min(e2e8, key=lambda r: r["ratio_vs_raw"])
    add(f"{label} vs raw boto3 loop, 8 shards", ">= 0.9x", worst["ratio_vs_raw"],
        _per_size(e2e8, "ratio_vs_raw"), worst["ratio_vs_raw"] >= 0.9)
    worst = min(e2e8, key=lambda r: r["ratio_vs_naive"])
    add(f"{label} vs naive driver-side reader, 8 shards", ">= 2x", worst["ratio_vs_naive"],
        _per_size(e2e8, "ratio_vs_naive"), worst["ratio_vs_naive"] >= 2.0)


def _ms(canned: dict[str, Any]) -> str:
    return f"{canned['latency_ms']:g} ms per request"


def _per_size(rows: list[dict[str, Any]], key: str) -> str:
    return ", ".join(f"{r[key]:.2f}x ({_size(r['record_bytes'])})" for r in rows)


def _size(n: int) -> str:
    return f"{n // 1024} KB" if n >= 1024 else f"{n} B"


def _s(s: dict[str, Any], digits: int = 0, scale: float = 1.0) -> str:
    return f"{s['median'] * scale:,.{digits}f} ({s['spread'] * scale:,.{digits}f})"


def render(res: dict[str, Any]) -> str:
    """The generated Markdown: provenance, the targets, then one table per benchmark."""
    m = res["machine"]
    libs = ", ".join(f"{k} {v}" for k, v in m["libraries"].items() if v)
    lines = [
        BEGIN,
        "",
        f"Produced by `{res['command']}` on {res['date']} "
        f"({'smoke sizes' if res.get('quick') else 'full sizes'}), in one run on one machine: "
        f"{m['cores']} cores, {m['memory_gib']} GiB, {m['platform']}, Python {m['python']}, "
        f"{m['java'] or 'Java ?'}; {libs}. Results file: `{res['results_file']}`. Figures are "
        "medians over repeated runs, spread (max - min) in parentheses.",
        "",
        "### Targets",
        "",
        "| target | goal | measured | result |",
        "|---|---|---|---|",
    ]
    for t in targets(res):
        lines.append(f"| {t['target']} | {t['goal']} | {t['shown']} | "
                     f"{'pass' if t['pass'] else '**fail**'} |")
    lines += _read_path(res) + _kpl(res) + _e2e(res) + _planning(res) + _commit(res)
    lines += _overhead(res) + _memory(res) + ["", END]
    return "\n".join(lines)


def _read_path(res: dict[str, Any]) -> list[str]:
    rows = res.get("read_path")
    if not rows:
        return []
    out = ["", "### 1. Read path, no server (user records/s on one core)", "",
           "| page | record size | (a) botocore parse | (b) kinesis-ddb read path | b/a |",
           "|---|---|---|---|---|"]
    for r in rows:
        page = ("KPL aggregates" if r["kind"] == "kpl" else "plain") + \
            f", {r['user_records']:,} user records in {r['kinesis_records']:,} Kinesis records"
        out.append(f"| {page} | {_size(r['record_bytes'])} | {_s(r['botocore_parse_rps'])} | "
                   f"{_s(r['read_path_rps'])} | {r['ratio_b_over_a']:.2f} |")
    return out


def _kpl(res: dict[str, Any]) -> list[str]:
    rows = res.get("kpl")
    if not rows:
        return []
    names = list(rows[0]["decoders"])
    out = ["", "### KPL de-aggregation alone (user records/s on one core)", "",
           "| user record size | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for r in rows:
        out.append(f"| {_size(r['record_bytes'])} | " +
                   " | ".join(_s(r["decoders"][n]) for n in names) + " |")
    return out


def _e2e(res: dict[str, Any]) -> list[str]:
    out = _e2e_table("### 2. End to end, moto server (records/s reading a fixed backlog)",
                     res.get("e2e"))
    canned = res.get("e2e_canned")
    if canned:
        out += _e2e_table(
            f"### 2b. End to end, canned Kinesis server, {_ms(canned)} (records/s reading a "
            "fixed backlog; DynamoDB on moto)", canned["rows"])
    return out


def _e2e_table(title: str, rows: list[dict[str, Any]] | None) -> list[str]:
    if not rows:
        return []
    out = ["", title, "",
           "| shards | record size | backlog | (a) raw boto3 loop | (b) naive driver-side reader | "
           "kinesis-ddb | x raw | x naive | kinesis-ddb incl. query start |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r["rps"]
        out.append(
            f"| {r['shards']} | {_size(r['record_bytes'])} | {r['records']:,} | "
            f"{_s(p['raw_boto3'])} | {_s(p['naive'])} | {_s(p['kinesis_ddb'])} | "
            f"{r['ratio_vs_raw']:.2f} | {r['ratio_vs_naive']:.2f} | "
            f"{_s(r['rps_with_query_start']['kinesis_ddb'])} |"
        )
    phases = rows[-1].get("kinesis_ddb_phase_seconds", {})
    if phases:
        batches = rows[-1].get("kinesis_ddb_batches")
        out += ["", f"kinesis-ddb's batch time by phase ({rows[-1]['shards']} shards, "
                f"{_size(rows[-1]['record_bytes'])}; seconds, median"
                + (f", {batches:g} batch(es) with data" if batches else "") + "): " +
                ", ".join(f"{k} {v:.2f}" for k, v in sorted(phases.items()))]
    calls = rows[-1].get("kinesis_calls_last_turn")
    if calls:
        out += ["", "Kinesis calls per reader (same backlog, last turn): " + "; ".join(
            f"{who} " + ", ".join(f"{n} {op}" for op, n in sorted(c.items()))
            for who, c in calls.items())]
    return out


def _planning(res: dict[str, Any]) -> list[str]:
    plan = res.get("planning")
    if not plan:
        return []
    out = ["", "### 3. Planning, moto server (`Planner.latest_offset`, steady state)", "",
           "| shards | new records per shard | idle: time | idle: calls, bytes | new data: time | "
           "new data: driver CPU | new data: calls, records, bytes | batch bytes | probe / batch |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in [*plan["cases"], plan["sustained"]]:
        i, n = r["idle"], r["new_data"]
        out.append(
            f"| {r['shards']:,} | {r['rounds']} | {_s(i['seconds'], 3)} s | "
            f"{i['calls']:.0f}, {i['bytes']:,.0f} B | {_s(n['seconds'], 3)} s | "
            f"{n['cpu_seconds']['median']:.3f} s | {n['calls']:.0f}, {n['records']:.0f}, "
            f"{n['bytes']:,.0f} B | {n['batch_bytes']:,.0f} B | {n['probe_pct_of_batch']:.2f}% |"
        )
    out += ["", f"1,000 / 10 shards: {plan['ratio_1000_over_10_new_data']:.1f}x with new data, "
            f"{plan['ratio_1000_over_10_idle']:.1f}x idle."]
    return out


def _commit(res: dict[str, Any]) -> list[str]:
    rows = res.get("commit")
    if not rows:
        return []
    out = ["", "### 4. Commit (`CheckpointStore.commit`)", "",
           "| shards | calls | time, instant DynamoDB stub (client side) | time, moto server |",
           "|---|---|---|---|"]
    for r in rows:
        moto = f"{_s(r['moto_seconds'], 3)} s" if "moto_seconds" in r else "not run (see below)"
        out.append(f"| {r['shards']:,} | {r['calls']} | {_s(r['seconds'], 3)} s | {moto} |")
    return out


def _overhead(res: dict[str, Any]) -> list[str]:
    o = res.get("overhead")
    if not o:
        return []
    phases = o["kinesis_ddb_phase_seconds"]
    floor = o.get("python_floor_bps")
    out = ["", "### 5. Per-batch overhead (near-empty batches, triggers back to back, `noop` sink)",
           "", "| source | batches/s | median batch (triggerExecution) |", "|---|---|---|",
           f"| kinesis-ddb ({o['shards']} shards, {o['kinesis_ddb_rows_per_batch']:.0f} rows per batch) "
           f"| {_s(o['kinesis_ddb_bps'], 2)} | {phases.get('triggerExecution', 0) * 1000:.0f} ms |",
           f"| rate-micro-batch ({o['shards']} partitions) | {_s(o['rate_bps'], 2)} | "
           f"{o['rate_phase_seconds'].get('triggerExecution', 0) * 1000:.0f} ms |"]
    if floor:
        out.append(f"| python-floor (a Python source without I/O, {o['shards']} partitions) | "
                   f"{_s(floor, 2)} | "
                   f"{o['python_floor_phase_seconds'].get('triggerExecution', 0) * 1000:.0f} ms |")
    line = "Batch by phase (ms, median): kinesis-ddb " + ", ".join(
        f"{k} {v * 1000:.0f}" for k, v in sorted(phases.items()) if k != "triggerExecution")
    if floor:
        line += "; python-floor " + ", ".join(
            f"{k} {v * 1000:.0f}" for k, v in sorted(o["python_floor_phase_seconds"].items())
            if k != "triggerExecution")
    return out + ["", line + "."]


def _memory(res: dict[str, Any]) -> list[str]:
    m = res.get("memory")
    if not m:
        return []
    return ["", "### 6. Memory (executor read path in its own process, canned HTTP server)", "",
            "| range | RSS after first page | RSS peak | growth | records/s |", "|---|---|---|---|---|",
            f"| {m['records']:,} records of {m['record_bytes']} B | "
            f"{_s(m['rss_after_first_page_mib'], 1)} MiB | {_s(m['rss_peak_mib'], 1)} MiB | "
            f"{_s(m['growth_mib'], 1)} MiB | {_s(m['records_per_second'])} |"]


def update_doc(doc: Path, generated: str) -> None:
    """Replace the generated part of ``doc`` (or append it when the markers are missing)."""
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        text = head + generated + tail
    else:
        text = text.rstrip("\n") + "\n\n" + generated + "\n"
    doc.write_text(text)


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--doc", type=Path, default=Path("docs/benchmarks.md"))
    args = parser.parse_args()
    update_doc(args.doc, render(json.loads(args.results.read_text())))


if __name__ == "__main__":
    main()
