"""The ``cost`` suite's targets and table in ``docs/benchmarks.md``, and the cost table of
``docs/operations.md`` (between its own markers), from the suite's results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

OPS_BEGIN = "<!-- BEGIN GENERATED COST TABLE: python -m benchmarks.report -->"
OPS_END = "<!-- END GENERATED COST TABLE -->"

# AWS list prices, us-east-1, as published on aws.amazon.com/dynamodb/pricing and
# aws.amazon.com/kinesis/data-streams/pricing (read 2025-06; this machine cannot reach them).
PRICES_DATE = "2025-06"
WRU_USD_PER_MILLION = 0.625  # DynamoDB on-demand write request units
RRU_USD_PER_MILLION = 0.125  # DynamoDB on-demand read request units
EFO_USD_PER_GB = 0.013  # enhanced fan-out data retrieval (provisioned streams)
EFO_USD_PER_CONSUMER_SHARD_HOUR = 0.015
HOURS_PER_MONTH = 730
# What the table assumes of the 10% active shards' data (fan-out bills each GB received once).
ACTIVE_KIB_PER_S = 100


def targets(add: Any, cost: dict[str, Any] | None) -> None:
    """Issue 50's rows."""
    if not cost:
        return
    kcl = cost["kcl_wru_per_shard_minute"]
    for interval, share in ((0, 10), (10_000, 50)):
        rows = [r for r in cost["rows"] if r["interval_ms"] == interval and r["shards"] >= 1000]
        if not rows:
            continue
        worst = max(r["wru_per_shard_minute"] for r in rows)
        goal = kcl / share
        label = "every batch" if interval == 0 else f"checkpointIntervalMs={interval}"
        add(f"DynamoDB WRU per shard per minute, 10% moving, {label}, {_counts(rows)} shards",
            f"<= 1/{share} of KCL's {kcl:.1f} ({goal:.2f})", worst,
            ", ".join(f"{r['wru_per_shard_minute']:.3f} ({r['shards']:,})" for r in rows), worst <= goal)
    same = cost.get("same_moving") or []
    if len(same) > 1:
        per = [r["wru_per_batch"] for r in same]
        ratio = max(per) / min(per)
        add(f"WRU per commit with the same 40 shards moving, {_counts(same)} shards", "within 1.5x", ratio,
            ", ".join(f"{r['wru_per_batch']:.1f}" for r in same) + f" ({ratio:.2f}x)", ratio <= 1.5)


def _counts(rows: list[dict[str, Any]]) -> str:
    return "/".join(f"{r['shards']:,}" for r in rows)


def section(res: dict[str, Any]) -> list[str]:
    """The suite's table in ``docs/benchmarks.md``."""
    cost = res.get("cost")
    if not cost:
        return []
    lines = ["", "### 12. Cost: DynamoDB units of the checkpoints (sizing front on moto)", "",
             f"A batch a second, 10% of the shards moving in each, {cost['rows'][0]['batches']} "
             "batches per case; units counted by DynamoDB's sizing rules at the front. KCL's "
             f"floor: {cost['kcl_wru_per_shard_minute']:.1f} WRU per shard per minute (lease renewals).",
             "", "| shards | moving | commit interval | WRU per batch | WRU per shard per minute | "
             "x KCL's floor | RRU per shard per minute | by operation (WRU) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in [*cost["rows"], *cost.get("same_moving", [])]:
        ops = ", ".join(f"{k} {v:,}" for k, v in sorted(r["write_units_by_operation"].items()))
        lines.append(
            f"| {r['shards']:,} | {r['moving']:,} | {r['interval_ms'] / 1000:g} s | {r['wru_per_batch']:.1f} | "
            f"{r['wru_per_shard_minute']:.3f} | {r['kcl_ratio']:.4f} | {r['rru_per_shard_minute']:.3f} | {ops} |")
    return lines


def operations_table(cost: dict[str, Any]) -> str:
    """The cost table of ``docs/operations.md``: per hour and per month at each shard count."""
    kcl = cost["kcl_wru_per_shard_minute"]
    lines = [OPS_BEGIN, "",
             "| shards | DynamoDB WRU / hour (every batch; `checkpointIntervalMs=10000`) | RRU / hour (every batch) | "
             "$ / month DynamoDB | KCL lease renewals: WRU / hour, $ / month | fan-out GB / month, $ | "
             "fan-out consumer-shard hours / month, $ |", "|---|---|---|---|---|---|---|"]
    by = {(r["shards"], r["interval_ms"]): r for r in cost["rows"]}
    for shards in sorted({r["shards"] for r in cost["rows"]}):
        every, slow = by.get((shards, 0)), by.get((shards, 10_000))
        if every is None:
            continue
        wru_h = every["wru_per_shard_minute"] * shards * 60
        slow_h = slow["wru_per_shard_minute"] * shards * 60 if slow else None
        rru_h = every["rru_per_shard_minute"] * shards * 60
        usd = (wru_h * WRU_USD_PER_MILLION + rru_h * RRU_USD_PER_MILLION) / 1e6 * HOURS_PER_MONTH
        kcl_h = kcl * shards * 60
        kcl_usd = kcl_h * WRU_USD_PER_MILLION / 1e6 * HOURS_PER_MONTH
        active = max(1, shards // 10)
        gb = active * ACTIVE_KIB_PER_S * 1024 * 3600 * HOURS_PER_MONTH / 1e9
        hours = shards * HOURS_PER_MONTH
        lines.append(
            f"| {shards:,} | {wru_h:,.0f}; {slow_h:,.0f} | {rru_h:,.0f} | {usd:,.2f} | {kcl_h:,.0f}, "
            f"{kcl_usd:,.2f} | {gb:,.0f}, {gb * EFO_USD_PER_GB:,.2f} | {hours:,}, "
            f"{hours * EFO_USD_PER_CONSUMER_SHARD_HOUR:,.2f} |" if slow_h is not None else
            f"| {shards:,} | {wru_h:,.0f}; - | {rru_h:,.0f} | {usd:,.2f} | {kcl_h:,.0f}, {kcl_usd:,.2f} | "
            f"{gb:,.0f}, {gb * EFO_USD_PER_GB:,.2f} | {hours:,}, {hours * EFO_USD_PER_CONSUMER_SHARD_HOUR:,.2f} |")
    lines += ["", f"Prices: DynamoDB on-demand ${WRU_USD_PER_MILLION} per million WRU and "
              f"${RRU_USD_PER_MILLION} per million RRU; enhanced fan-out ${EFO_USD_PER_GB} per GB received "
              f"and ${EFO_USD_PER_CONSUMER_SHARD_HOUR} per consumer-shard hour (us-east-1, list prices "
              f"as of {PRICES_DATE}; check the pricing pages for yours). Fan-out GB assume the active 10% "
              f"of the shards at {ACTIVE_KIB_PER_S} KiB/s each, received once (`efoSubscriptions=query`); "
              "polling has no per-GB charge on provisioned streams. A month is "
              f"{HOURS_PER_MONTH} hours. The DynamoDB figures are `python -m benchmarks --only cost`'s, "
              "per hour of batches a second.", "", OPS_END]
    return "\n".join(lines)


def update_operations(doc: Path, res: dict[str, Any]) -> None:
    """Rewrite the cost table of ``doc`` between its markers, when ``res`` has the suite."""
    cost = res.get("cost")
    if not cost or not doc.exists():
        return
    text = doc.read_text()
    if OPS_BEGIN not in text or OPS_END not in text:
        return
    head, rest = text.split(OPS_BEGIN, 1)
    doc.write_text(head + operations_table(cost) + rest.split(OPS_END, 1)[1])
