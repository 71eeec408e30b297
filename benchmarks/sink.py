"""Sink: ``df.write.format("kinesis-ddb")`` on moto behind the quota-enforcing proxy of
``tests/support/quota.py`` (Kinesis' write quotas per shard: 1,000 records/s and 1 MiB/s of data
and partition keys, every writer together, each a bucket one second deep; ``PutRecords`` judged
record by record, the records past the quota refused inside the answer).

Every write goes through the proxy (it forwards writes to one stream one at a time: moto server
loses records under concurrent ``PutRecords`` to one shard), a fresh proxy and a fresh stream per
measurement (moto's ``PutRecord`` copies the shard's keys for every record, so a fuller shard
writes slower). Records are ``lpad(<row number>, size, 'x')`` as data and one of ``KEYS``
partition keys (row ``i`` has key ``i % KEYS``); on 4 shards the keys are chosen by their MD5 so
that each shard owns a quarter of them, and every shard gets the same records.

1. **Throughput** (``THROUGHPUT_SHARDS`` shards, ``THROUGHPUT_RECORDS`` records of
   ``THROUGHPUT_BYTES`` bytes; ``--quick``: ``QUICK_THROUGHPUT_RECORDS``), each writer in turn
   within a repeat (``REPEATS``; ``--quick``: 1), after one warm-up write not counted:

   - *raw*: what a user hand-writes in ``foreachBatch``: ``PutRecords`` of 500 records in a loop,
     the failed records of each answer sent again at once until none is left, counting them; in a
     child process (the proxy shares this process's interpreter: a loop beside it would wait for
     its GIL), its records built before the clock starts, the loop timed;
   - *sink*: one batch write of a DataFrame of the same rows (``THROUGHPUT_PARTITIONS``
     partitions, the session's parallelism on ``local[2]``: two tasks writing every shard),
     built and cached before the clock starts, ``.save()`` timed; default options;
   - *sink, aggregate=true* (for information: KPL aggregates are not bound by the 1,000
     records/s quota): user records/s;
   - for information, where the sink's time goes (``SINK_WRITERS``): the same write by one task
     (``.coalesce(1)``); by one task with ``preserveKeyOrder=false`` (requests of up to 500
     records in row order, instead of one record per partition key: 64 here); and by the two
     tasks each given half of every shard's quota (``HALF_QUOTA``, as docs/sink.md advises for
     tasks writing the same shards).

   Records/s is the records over the timed seconds; also each writer's write window (first to
   last accepted record at the proxy), its ``PutRecords`` calls, the records the quota refused,
   and the records accepted and refused in each second of the window, from the proxy. The quota
   floor: every shard's records past the bucket's first second at 1,000 a second. Target: sink
   / raw records/s (medians) >= 1.
2. **Write rate against the quota**: one write of ``RATE_MIB_PER_SHARD`` MiB per shard of
   ``RATE_RECORD_BYTES``-byte records (``--quick``: ``QUICK_RATE_MIB_PER_SHARD``, 1 shard only) to
   a 1-shard and to a 4-shard stream, by a single task (``.coalesce(1)``); per shard, the bytes
   written over its write window (first to last accepted record, from the proxy's
   ``written()``), as a ratio of 1 MiB/s (the target: >= 0.9 with 0 records refused), the same
   without the bucket's first second (bytes - 1 MiB over the window: at most 1.0 under the
   quota), the busiest 1-second window, and the records refused. The same again with two tasks
   writing the same shards at once (``.repartition(2)``), for information: each task paces by
   its own budget of the whole quota, so they refuse each other's records until their rates
   settle (the sink's AIMD); its ratio and refusals as measured.

    python -m benchmarks.sink [--quick]
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import multiprocessing
import statistics
import time
from typing import Any

import boto3

from benchmarks.common import PUT_BATCH, REGION, create_stream, describe, settings, summary
from tests.support.quota import QuotaProxy, _heaviest

MIB = 1024 * 1024
SHARD_RECORDS_PER_S = 1000
SHARD_BYTES_PER_S = MIB
KEYS = 64

THROUGHPUT_SHARDS = 4
THROUGHPUT_RECORDS, QUICK_THROUGHPUT_RECORDS = 40_000, 8_000
THROUGHPUT_BYTES = 100
THROUGHPUT_PARTITIONS = 2  # the session's parallelism (local[2])
REPEATS, QUICK_REPEATS = 3, 1
WARMUP_RECORDS = 2_000

RATE_RECORD_BYTES = 4096
RATE_MIB_PER_SHARD, QUICK_RATE_MIB_PER_SHARD = 12, 4
RATE_SHARD_COUNTS, QUICK_RATE_SHARD_COUNTS = (1, 4), (1,)


# -- records --------------------------------------------------------------------------------


def _ranges(url: str, stream: str) -> list[tuple[int, int, str]]:
    """(start, end, shard id) of the stream's shards."""
    client = settings(url).boto3_client("kinesis")
    shards = client.list_shards(StreamName=stream)["Shards"]
    return sorted((int(s["HashKeyRange"]["StartingHashKey"]), int(s["HashKeyRange"]["EndingHashKey"]),
                   s["ShardId"]) for s in shards)


def balanced_keys(ranges: list[tuple[int, int, str]], n: int = KEYS) -> list[str]:
    """``n`` partition keys, as many routed (by their MD5) to each shard of ``ranges``, ordered so
    that consecutive keys take the shards in turn."""
    per = n // len(ranges)
    by_shard: list[list[str]] = [[] for _ in ranges]
    i = 0
    while any(len(keys) < per for keys in by_shard):
        key = f"k{i}"
        i += 1
        h = int.from_bytes(hashlib.md5(key.encode()).digest(), "big")
        j = next(j for j, (lo, hi, _) in enumerate(ranges) if lo <= h <= hi)
        if len(by_shard[j]) < per:
            by_shard[j].append(key)
    return [by_shard[j][k] for k in range(per) for j in range(len(ranges))]


def _data(i: int, size: int) -> bytes:
    """Row ``i``'s data, as the DataFrame's ``lpad(CAST(id AS STRING), size, 'x')``."""
    return str(i).rjust(size, "x").encode()


def frame(spark: Any, n: int, size: int, keys: list[str], partitions: int) -> Any:
    """The rows of :func:`_data` with their keys, ``partitions`` partitions, cached and counted."""
    from pyspark.sql import functions as F

    df = spark.range(0, n, 1, partitions).select(
        F.lpad(F.col("id").cast("string"), size, "x").cast("binary").alias("data"),
        F.element_at(F.array(*[F.lit(k) for k in keys]), (F.col("id") % len(keys)).cast("int") + 1)
        .alias("partitionKey"),
    ).cache()
    assert df.count() == n
    return df


def _sink_options(proxy_url: str, stream: str, **extra: str) -> dict[str, str]:
    return {"streamName": stream, "endpointUrl": proxy_url, "region": REGION, "awsAccessKeyId": "local",
            "awsSecretKey": "local", **extra}


def _save(df: Any, options: dict[str, str]) -> tuple[float, float]:
    """One batch write of ``df``: its start and end (``time.monotonic()``, the proxy's clock)."""
    writer = df.write.format("kinesis-ddb").mode("append")
    for k, v in options.items():
        writer = writer.option(k, v)
    began = time.monotonic()
    writer.save()
    return began, time.monotonic()


# -- what the proxy saw ----------------------------------------------------------------------


def _span(points: list[tuple[float, int]]) -> tuple[float, float]:
    """The first and the last time of ``points`` (0, 0 if none)."""
    return (points[0][0], points[-1][0]) if points else (0.0, 0.0)


def _window(points: list[tuple[float, int]]) -> float:
    return points[-1][0] - points[0][0] if len(points) > 1 else 0.0


def _per_second(points: list[tuple[float, int]], t0: float, end: float, nbytes: bool = False) -> list[int]:
    """How many of ``points`` (``nbytes``: their bytes) fall in each second from ``t0`` to
    ``end`` (one before ``t0`` counts in the first)."""
    out = [0] * (int(end - t0) + 1)
    for t, n in points:
        out[min(len(out) - 1, max(0, int(t - t0)))] += n if nbytes else 1
    return out


def _write_figures(proxy: QuotaProxy, stream: str) -> dict[str, Any]:
    """The stream's accepted and refused records, ``PutRecords`` calls and write window."""
    written = proxy.written(stream)
    refused = proxy.refused_records(stream)
    return {
        "records_written": len(written),
        # for reading what happened: records accepted and refused (every shard) in each second
        # from the first accepted record
        "accepted_per_second": _per_second(written, *_span(written)),
        "refused_per_second": _per_second(refused, *_span(written)),
        "bytes_written": sum(n for _, n in written),
        "refused": len(refused),
        "calls": len(proxy.calls("PutRecords")),
        "window_seconds": _window(written),
        "first_accepted": written[0][0] if written else None,
        "last_accepted": written[-1][0] if written else None,
        "records_per_shard": {shard: len(proxy.written(st, shard)) for st, shard in proxy.write_shards()
                              if st == stream},
    }


# -- 1. throughput ---------------------------------------------------------------------------


def raw_loop(url: str, stream: str, n: int, size: int, keys: list[str]) -> dict[str, Any]:
    """The hand-written loop (runs in a child process): ``PutRecords`` of 500 records in a loop,
    each answer's failed records sent again at once; seconds, calls and records refused."""
    client = boto3.client("kinesis", endpoint_url=url, region_name=REGION, aws_access_key_id="local",
                          aws_secret_access_key="local")
    records = [{"Data": _data(i, size), "PartitionKey": keys[i % len(keys)]} for i in range(n)]
    calls = refused = 0
    began = time.perf_counter()
    for start in range(0, n, PUT_BATCH):
        batch = records[start:start + PUT_BATCH]
        while batch:
            resp = client.put_records(StreamName=stream, Records=batch)
            calls += 1
            batch = [rec for rec, res in zip(batch, resp["Records"], strict=True) if "ErrorCode" in res]
            refused += len(batch)
    return {"seconds": time.perf_counter() - began, "calls": calls, "refused": refused}


def _raw_turn(pool: Any, url: str, n: int, size: int, keys: list[str]) -> dict[str, Any]:
    client = settings(url).boto3_client("kinesis")
    stream = create_stream(client, THROUGHPUT_SHARDS, "sink-raw")
    with QuotaProxy(url) as proxy:
        own = pool.submit(raw_loop, proxy.url, stream, n, size, keys).result()
        seen = _write_figures(proxy, stream)
    del seen["first_accepted"], seen["last_accepted"]
    assert seen["records_written"] == n, f"raw loop: {seen['records_written']} of {n} records written"
    assert seen["refused"] == own["refused"], (seen["refused"], own["refused"])
    return {**seen, "seconds": own["seconds"], "rps": n / own["seconds"]}


def _sink_turn(df: Any, url: str, n: int, **extra: str) -> dict[str, Any]:
    client = settings(url).boto3_client("kinesis")
    stream = create_stream(client, THROUGHPUT_SHARDS, "sink")
    with QuotaProxy(url) as proxy:
        began, ended = _save(df, _sink_options(proxy.url, stream, **extra))
        seen = _write_figures(proxy, stream)
    if not extra.get("aggregate"):
        assert seen["records_written"] == n, f"sink: {seen['records_written']} of {n} records written"
    first = seen.pop("first_accepted")
    last = seen.pop("last_accepted")
    return {**seen, "seconds": ended - began, "rps": n / (ended - began),
            "before_first_accepted": first - began if first else None,
            "after_last_accepted": ended - last if last else None}


# Each of two tasks its share of every shard's quota, as docs/sink.md advises for n tasks.
HALF_QUOTA = {"maxWriteRatePerShard": "512KiB", "maxRecordsPerSecondPerShard": "500"}
# The sink's settings, each one writer of a turn: (name, label, one task, extra options). ``sink``
# is the target's; the others are for information (what KPL aggregation does, and how the time
# splits between one task's requests and two tasks sharing each shard's quota).
SINK_WRITERS: tuple[tuple[str, str, bool, dict[str, str]], ...] = (
    ("sink", "sink", False, {}),
    ("sink_aggregate", "sink, `aggregate=true`", False, {"aggregate": "true"}),
    ("sink_one_task", "sink, one task (`.coalesce(1)`)", True, {}),
    ("sink_one_task_unordered", "sink, one task, `preserveKeyOrder=false`", True, {"preserveKeyOrder": "false"}),
    ("sink_half_quota", "sink, each task half the quota (`maxWriteRatePerShard=512KiB`, "
     "`maxRecordsPerSecondPerShard=500`)", False, HALF_QUOTA),
)
WRITERS = ("raw", *(name for name, _, _, _ in SINK_WRITERS))
LABELS = {"raw": "raw boto3 loop", **{name: label for name, label, _, _ in SINK_WRITERS}}


def _summaries(turns: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("rps", "seconds", "window_seconds", "refused", "calls", "records_written",
            "before_first_accepted", "after_last_accepted")
    return {k: summary(t[k] for t in turns) for k in keys if all(t.get(k) is not None for t in turns)}


def throughput(spark: Any, url: str, quick: bool) -> dict[str, Any]:
    """The writers in turn, ``REPEATS`` times (see the module docstring)."""
    n = QUICK_THROUGHPUT_RECORDS if quick else THROUGHPUT_RECORDS
    repeats = QUICK_REPEATS if quick else REPEATS
    client = settings(url).boto3_client("kinesis")
    keys = balanced_keys(_ranges(url, create_stream(client, THROUGHPUT_SHARDS, "sink-keys")))
    df = frame(spark, n, THROUGHPUT_BYTES, keys, THROUGHPUT_PARTITIONS)
    warm = frame(spark, WARMUP_RECORDS, THROUGHPUT_BYTES, keys, THROUGHPUT_PARTITIONS)
    turns: dict[str, list[dict[str, Any]]] = {w: [] for w in WRITERS}
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
        # warm-up, not counted: the child's imports, Spark's Python workers, the sink settings
        _raw_turn(pool, url, WARMUP_RECORDS, THROUGHPUT_BYTES, keys)
        for _, _, one, extra in SINK_WRITERS:
            _sink_turn(warm.coalesce(1) if one else warm, url, WARMUP_RECORDS, **extra)
        for _ in range(repeats):
            turns["raw"].append(_raw_turn(pool, url, n, THROUGHPUT_BYTES, keys))
            for name, _, one, extra in SINK_WRITERS:
                turns[name].append(_sink_turn(df.coalesce(1) if one else df, url, n, **extra))
    df.unpersist()
    warm.unpersist()
    per_shard = n // THROUGHPUT_SHARDS
    floor = max(0, per_shard - SHARD_RECORDS_PER_S) / SHARD_RECORDS_PER_S
    out: dict[str, Any] = {
        "shards": THROUGHPUT_SHARDS,
        "records": n,
        "record_bytes": THROUGHPUT_BYTES,
        "keys": len(keys),
        "partitions": THROUGHPUT_PARTITIONS,
        "repeats": repeats,
        "quota_floor_seconds": floor,
        "quota_floor_rps": n / floor if floor else None,
        "labels": LABELS,
        "writer_order": list(WRITERS),  # (a JSON object's keys are written sorted)
        "writers": {w: _summaries(turns[w]) for w in WRITERS},
        "turns": turns,
    }
    rps = {w: out["writers"][w]["rps"]["median"] for w in WRITERS}
    out["ratio_sink_over_raw"] = rps["sink"] / rps["raw"]
    out["ratio_aggregate_over_raw"] = rps["sink_aggregate"] / rps["raw"]
    return out


# -- 2. write rate against the quota ----------------------------------------------------------


def _shard_rate(proxy: QuotaProxy, stream: str, shard: str) -> dict[str, Any]:
    written = proxy.written(stream, shard)
    refused = proxy.refused_records(stream, shard)
    window = _window(written)
    nbytes = sum(n for _, n in written)
    t0 = written[0][0] if written else 0.0
    return {
        "shard": shard,
        "records": len(written),
        "bytes": nbytes,
        "window_seconds": round(window, 3),
        "ratio": nbytes / window / SHARD_BYTES_PER_S if window else 0.0,
        # without the bucket's first second (full when the write starts): at most 1.0
        "ratio_without_burst": max(0, nbytes - SHARD_BYTES_PER_S) / window / SHARD_BYTES_PER_S if window else 0.0,
        "peak_1s_bytes": _heaviest(written, 1.0),
        "refused": len(refused),
        # for reading what happened: MiB accepted in each second of the window, and when (seconds
        # after the first accepted record) records were refused
        "mib_per_second": [round(b / MIB, 3) for b in _per_second(written, *_span(written), nbytes=True)],
        "refused_at_s": [round(t - t0, 3) for t, _ in refused],
    }


def write_rate(spark: Any, url: str, shards: int, mib_per_shard: float, tasks: int) -> dict[str, Any]:
    """One write of ``mib_per_shard`` MiB per shard by ``tasks`` task(s) (see the docstring)."""
    client = settings(url).boto3_client("kinesis")
    stream = create_stream(client, shards, "sink-rate")
    keys = balanced_keys(_ranges(url, stream))
    record = RATE_RECORD_BYTES + max(len(k) for k in keys)
    n = round(shards * mib_per_shard * MIB / record)
    df = frame(spark, n, RATE_RECORD_BYTES, keys, 2)
    shaped = df.coalesce(1) if tasks == 1 else df.repartition(tasks)
    with QuotaProxy(url) as proxy:
        began, ended = _save(shaped, _sink_options(proxy.url, stream))
        seen = _write_figures(proxy, stream)
        per = [_shard_rate(proxy, stream, shard) for st, shard in proxy.write_shards() if st == stream]
    df.unpersist()
    worst = min(per, key=lambda p: p["ratio"])
    return {
        "shards": shards,
        "tasks": tasks,
        "record_bytes": RATE_RECORD_BYTES,
        "records": n,
        "records_written": seen["records_written"],
        "bytes_written": seen["bytes_written"],
        "calls": seen["calls"],
        "seconds": round(ended - began, 3),
        "before_first_accepted": round(seen["first_accepted"] - began, 3) if seen["first_accepted"] else None,
        "after_last_accepted": round(ended - seen["last_accepted"], 3) if seen["last_accepted"] else None,
        "ratio_worst": worst["ratio"],
        "ratio_median": statistics.median(p["ratio"] for p in per),
        "ratio_without_burst_worst": min(p["ratio_without_burst"] for p in per),
        "peak_1s_mib": max(p["peak_1s_bytes"] for p in per) / MIB,
        "refused": sum(p["refused"] for p in per),
        "per_shard": per,
    }


# -- the suite -----------------------------------------------------------------------------


def _print_throughput(t: dict[str, Any]) -> None:
    w = t["writers"]
    for name in WRITERS:
        s, label = w[name], LABELS[name]
        print(f"  sink throughput {t['shards']} shards, {t['records']:,} x {t['record_bytes']} B: {label}: "
              f"{describe(s['rps'], ' records/s')}; {describe(s['seconds'], ' s', 2)}, write window "
              f"{describe(s['window_seconds'], ' s', 2)}; refused {describe(s['refused'])}; "
              f"PutRecords {describe(s['calls'])}", flush=True)
    print(f"  sink throughput: sink / raw {t['ratio_sink_over_raw']:.2f}x, aggregate / raw "
          f"{t['ratio_aggregate_over_raw']:.2f}x (quota floor {t['quota_floor_seconds']:.1f} s = "
          f"{t['quota_floor_rps'] or 0:,.0f} records/s)", flush=True)


def _print_rate(r: dict[str, Any]) -> None:
    print(f"  sink write rate {r['shards']} shard(s), {r['tasks']} task(s), {r['bytes_written'] / MIB:.1f} MiB: "
          f"worst shard {r['ratio_worst']:.3f} of 1 MiB/s ({r['ratio_without_burst_worst']:.3f} without the first "
          f"second's burst), peak 1-s {r['peak_1s_mib']:.2f} MiB; refused {r['refused']}; write {r['seconds']:.2f} s "
          f"({r['before_first_accepted']:.2f} s to the first accepted record); "
          f"{r['records_written']:,} of {r['records']:,} records", flush=True)


def run_suite(spark: Any, url: str, quick: bool) -> dict[str, Any]:
    """The two cases (see the module docstring), printed as they finish."""
    t = throughput(spark, url, quick)
    _print_throughput(t)
    mib = QUICK_RATE_MIB_PER_SHARD if quick else RATE_MIB_PER_SHARD
    rates = []
    for shards in QUICK_RATE_SHARD_COUNTS if quick else RATE_SHARD_COUNTS:
        for tasks in (1, 2):
            r = write_rate(spark, url, shards, mib, tasks)
            _print_rate(r)
            rates.append(r)
    return {"throughput": t, "write_rate": rates, "mib_per_shard": mib}


def main() -> None:
    """Command-line entry point."""
    from benchmarks import spark_env

    spark_env.suite_main(__doc__, run_suite)


if __name__ == "__main__":
    main()
