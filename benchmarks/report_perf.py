"""Issue 51's parts of ``docs/benchmarks.md``: the backlog read from the query's start
(``backlog_start``), and the catch-up runs' client CPU per GiB and CPU bound (``catchup``)."""

from __future__ import annotations

from typing import Any

MIB = float(1 << 20)
BOUND = 1.5  # the whole query within 1.5x of the physical limit plus Spark's start


def targets(add: Any, rows: list[dict[str, Any]] | None) -> None:
    """One row per Kinesis server: whole query / (physical limit + an empty query's time)."""
    for r in rows or []:
        m = r["median"]
        add(f"AvailableNow over a one-shard {r['backlog_bytes'] / MIB:.1f} MiB backlog from start(), "
            f"{_server(r)}: whole query / (physical limit + empty query)", f"<= {BOUND:g}x", r["ratio"],
            f"{r['ratio']:.2f}x ({m['whole_s']:.1f} s / ({r['physical_s']:.1f} + {r['empty_query_s']:.1f} s)); "
            f"first record delivered at {m['first_record_s']:.1f} s; refused {m['refused']:g}",
            r["ratio"] <= BOUND and m["refused"] == 0)


def _server(r: dict[str, Any]) -> str:
    return "moto" if r["backend"] == "moto" else "the canned server"


def section(res: dict[str, Any]) -> list[str]:
    """The table (empty without the suite's results)."""
    rows = res.get("backlog_start")
    if not rows:
        return []
    out = ["", "### 10b. A backlog read from the query's start (quota-enforcing proxy; one shard, 1,000-byte "
           "records, `Trigger.AvailableNow`, default options, `noop` sink)", "",
           "Seconds after `start()`, medians of the runs. Empty query: the same options over a shard "
           "with no records, after a warm-up one (Spark's own start of an AvailableNow query). Physical "
           "limit: (backlog - 10 MiB) / 2 MiB/s. First record delivered: the end of the first batch "
           "with rows. The driver's calls before the executors' first: the AvailableNow target's "
           "probe.", "",
           "| Kinesis server | backlog | whole query | physical + empty query | ratio | first record "
           "delivered | driver's first call | driver's calls before the read (last at) | executors' "
           "first call | last data call | batches | refused |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r["median"]
        out.append(
            f"| {r['backend']} | {r['backlog_bytes'] / MIB:.1f} MiB | {m['whole_s']:.2f} s | "
            f"{r['physical_s']:.2f} + {r['empty_query_s']:.2f} s | {r['ratio']:.2f} | {m['first_record_s']:.2f} s | "
            f"{m['first_driver_call_s']:.2f} s | {m['driver_calls_before_read']:g} "
            f"({m['last_driver_call_before_read_s']:.2f} s) | {m['first_executor_call_s']:.2f} s | "
            f"{m['last_data_call_s']:.2f} s | {m['batches']:g} | {m['refused']:g} |")
    return out


def _allowed(r: dict[str, Any]) -> tuple[float, float, float] | None:
    """(what the machine allows in records/s: the CPU's bound or the physical limit, whichever
    is lower; the CPU's; the physical limit's) of a catch-up run, None without the figures."""
    b = r.get("cpu_bound") or {}
    if not b.get("allowed_records_per_s"):
        return None
    physical = max(p["physical_s"] for p in r["per_shard"])
    physical_rps = r["records_written"] / physical if physical else float("inf")
    return min(b["allowed_records_per_s"], physical_rps), b["allowed_records_per_s"], physical_rps


def catchup_targets(add: Any, c: dict[str, Any] | None) -> None:
    """Client CPU per GiB against the raw loop's on the same backlog (every run, both servers);
    the 16-shard run on the canned server against what the machine allows."""
    runs = [r for r in (c or {}).get("catch_up", []) if "cpu_s_per_gib" in r]
    if not runs:
        return
    worst = max(runs, key=_cpu_ratio)
    add("catch-up (AvailableNow): client CPU per GiB / raw boto3 loop's, same backlog, both servers", "<= 1.0x",
        _cpu_ratio(worst), ", ".join(f"{_cpu_ratio(r):.2f}x ({r['backend']}, {r['shards']})" for r in runs)
        + ("; net of each one's start (the raw loop's reading; kinesis-ddb less the Python data source API's "
           "CPU for a query): " + ", ".join(f"{_net_ratio(r):.2f}x" for r in runs)
           if all("net_cpu_s_per_gib" in r for r in runs) else "")
        + "; / the json+base64 floor: " + ", ".join(
            f"{r['cpu_s_per_gib'] / r['floor_cpu_s_per_gib']:.1f}x" for r in runs), _cpu_ratio(worst) <= 1.0)
    for r in runs:
        allowed = _allowed(r)
        if r["backend"] != "canned" or r["shards"] != 16 or allowed is None:
            continue
        rps = r["cpu_bound"]["records_per_s"]
        add("catch-up, 16 shards on the canned server: records/s / what the machine allows (its CPU or the "
            "physical limit, the lower)", ">= 0.9; 0 refused", rps / allowed[0],
            f"{rps / allowed[0]:.2f} ({rps:,.0f} rec/s; the CPU allows {allowed[1]:,.0f}, the physical limit "
            f"{allowed[2]:,.0f}; client {r['cpu_bound']['client_cores']:.2f} of {r['cpu_bound']['cores_left']:.2f} "
            f"cores left by the servers); refused {r['refused_source']}",
            rps / allowed[0] >= 0.9 and r["refused_source"] == 0)


def _cpu_ratio(r: dict[str, Any]) -> float:
    return float(r["cpu_s_per_gib"] / r["raw_loop"]["cpu_s_per_gib"])


def _net_ratio(r: dict[str, Any]) -> float:
    """Client CPU per GiB less the Python data source API's for a query, / the raw loop's reading's."""
    return float(r["net_cpu_s_per_gib"] / r["raw_loop"]["loop_cpu_s_per_gib"])


def catchup_section(res: dict[str, Any]) -> list[str]:
    """The catch-up runs' CPU table (empty without those figures)."""
    runs = [r for r in (res.get("catchup") or {}).get("catch_up", []) if "cpu_s_per_gib" in r]
    if not runs:
        return []
    out = ["", "CPU of the catch-up runs (the first table of section 10). Client CPU: every process of the "
           "client from `/proc` (Spark's JVM, its Python processes: the planning helper, the daemon and "
           "workers; the thread driving the query), over the whole query, per GiB of record data; the raw "
           "boto3 loop (`benchmarks/raw_loop.py`, a thread per shard in its own process, botocore's standard"
           " retries) read the same backlog through a new quota proxy; the floor parses the same pages with "
           "`json` and decodes their data with `base64` on one core. CPU bound, over the executors' read "
           "window (every shard): the cores the client used, the cores the servers left it (2 less moto or "
           "the canned server and the proxy's threads), the records/s the CPU allows (the client's records/s"
           " per core times the cores left) and the physical limit's records/s; measured / the lower of the "
           "two." + (" The raw loop's CPU is its whole process's (its start, `import boto3` and its client too, "
                     "as the query's start is counted); net: kinesis-ddb's less what one query of the Python "
                     "floor source (no I/O, as many tasks) costs, against the raw loop's reading alone."
                     if all("loop_cpu_s_per_gib" in r["raw_loop"] for r in runs) else ""), "",
           "| Kinesis server | shards | client CPU s per GiB | raw loop: CPU s per GiB, seconds, refused | floor "
           "| x raw | x floor | net: kinesis-ddb, raw loop (CPU s per GiB), x raw | client cores / cores left "
           "| records/s | CPU allows | physical limit | measured / the lower |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        raw, b, allowed = r["raw_loop"], r.get("cpu_bound") or {}, _allowed(r)
        bound = (f"{b['client_cores']:.2f} / {b['cores_left']:.2f} | {b['records_per_s']:,.0f} | "
                 f"{allowed[1]:,.0f} | {allowed[2]:,.0f} | {b['records_per_s'] / allowed[0]:.2f}"
                 if allowed else "- | - | - | - | -")
        out.append(f"| {r['backend']} | {r['shards']} | {r['cpu_s_per_gib']:.1f} | {raw['cpu_s_per_gib']:.1f}, "
                   f"{raw['seconds']:.1f} s, {raw['refused']} | {r['floor_cpu_s_per_gib']:.1f} | "
                   f"{_cpu_ratio(r):.2f} | {r['cpu_s_per_gib'] / r['floor_cpu_s_per_gib']:.1f} | "
                   + (f"{r['net_cpu_s_per_gib']:.1f}, {raw['loop_cpu_s_per_gib']:.1f}, {_net_ratio(r):.2f}"
                      if "net_cpu_s_per_gib" in r else "-") + f" | {bound} |")
    return out
