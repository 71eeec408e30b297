"""End to end on a local server (moto): a fixed backlog on 4 and 8 shards (100 B and 1 KB
records) read by a Spark query into the ``noop`` sink, records/s, against two baselines in the
same run on the same streams:

- (a) a raw boto3 ``GetRecords`` loop, one thread per shard, in a process of its own (no Spark:
  the client floor; ``benchmarks/raw_loop.py``);
- (b) the naive driver-side ``SimpleDataSourceStreamReader`` of ``benchmarks/naive.py``.

All three read through the same quota-enforcing proxy (``tests/support/quota.py``: 5
``GetRecords`` a second and 2 MiB/s from a 10 MiB bucket per shard, as Kinesis), a new one for
each reader's turn, so each starts with full buckets; both baselines retry a refused call as
botocore's standard retry mode does (its backoff; attempts raised so that none gives up).
Backlogs under quotas are ``QUOTA_PER_SHARD`` records a shard (1 KB records beyond the burst,
100 B records several seconds of CPU); ``--no-quotas`` reads the earlier fixed backlogs straight
from the server (the reference before issue 51).

Each turn's client CPU is counted from ``/proc`` (``benchmarks/client_cpu.py``: Spark's JVM, its
Python processes and the thread driving the query, from ``start()`` to the last row; the raw
loop's whole process, its start, ``import boto3`` and client included) per GiB of record data
delivered, beside a floor: the same pages parsed with ``json`` and their data decoded with
``base64`` on one core, nothing else (``raw_loop.decode_floor``). Each turn also runs one batch of
the Python floor source (``benchmarks/floor_source.py``, no I/O, as many partitions as kinesis-ddb
plans tasks for the shards, ``Trigger.Once``): the client
CPU of that query is what the Python data source API costs one query of any Python source (its
planning helper's start, Spark's query start, the tasks); the "net" figures take it from
kinesis-ddb's, and the raw loop's start from its own, leaving what each spends on the records.

The three readers take turns within each repeat, so a slow moment of the machine hits them alike.
A Spark reader's time is the ``triggerExecution`` time of the batches that read the backlog (the
one-time query start is reported apart, as ``rps_with_query_start``); one warm-up turn of each
reader runs first and is not counted.

The same three readers, shard counts and record sizes run a second time against the canned
Kinesis server of ``benchmarks/canned.py`` (``e2e_canned``): a server in its own process that
serves pre-built pages at once after a fixed latency per request, like a remote service, so that
the readers' own costs show instead of moto's. kinesis-ddb keeps its DynamoDB checkpoints on
moto. The latency, 20 ms by default, is the order of a ``GetRecords`` round trip to AWS from
within its region (a remote call, TLS and Kinesis' own service time); it is constant, so a
reader's time is its number of sequential calls times the latency plus its CPU.

    python -m benchmarks.e2e [--quick] [--canned [--latency 0.02]] [--no-quotas]
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

import boto3

from benchmarks import raw_loop, spark_env
from benchmarks.canned import CannedKinesisServer, StreamSpec
from benchmarks.client_cpu import ClientCpu
from benchmarks.common import (
    REGION,
    create_stream,
    describe,
    fill_backlog,
    local_env,
    source_options,
    summary,
)
from kinesis_source.tools.local import LocalEndpoint
from tests.support.quota import QuotaProxy

SHARD_COUNTS = (4, 8)
RECORD_SIZES = (100, 1024)
# How a quota proxy tells the readers apart (source_options' key is "local").
ACCESS_KEYS = {"raw_boto3": raw_loop.ACCESS_KEY, "naive": "naive", "kinesis_ddb": "local"}
# One checkpoint table for every query, made by the warm-up, so no measured batch creates it.
TABLE = {"checkpointTable": "kinesis-ddb-bench-e2e"}
# Per-request latency of the canned server: a GetRecords round trip to AWS within a region.
CANNED_LATENCY_S = 0.020
# (records per stream, repeats) on the canned server, by --quick.
CANNED_SIZES = {True: (8000, 3), False: (96000, 3)}
# Under quotas, records per shard by (server, record size): enough that the quotas and a
# query's start are not the whole story: 1 KB records beyond the 10 MiB burst (and the
# overdraw a large page may make), 100 B records several seconds of a reader's CPU. --quick: a tenth.
QUOTA_PER_SHARD = {("moto", 100): 16_000, ("moto", 1024): 24_000,
                   ("canned", 100): 80_000, ("canned", 1024): 40_000}


def measure(
    spark: Any, url: str, shards: int, size: int, records: int, repeats: int, warmup: int = 0,
    quotas: bool = True,
) -> dict[str, Any]:
    """The three readers on a new moto stream holding ``records`` records of ``size`` bytes."""
    client = boto3.client("kinesis", endpoint_url=url, region_name=REGION)
    stream = create_stream(client, shards, "e2e")
    per_shard = fill_backlog(client, stream, records, size)
    return measure_readers(spark, url, url, stream, per_shard, size, repeats, warmup, quotas=quotas)


def measure_readers(
    spark: Any,
    url: str,
    ddb_url: str,
    stream: str,
    per_shard: dict[str, int],
    size: int,
    repeats: int,
    warmup: int = 0,
    server: Any = None,
    quotas: bool = False,
) -> dict[str, Any]:
    """The three readers on one backlog (Kinesis at ``url``, kinesis-ddb's checkpoints in
    DynamoDB at ``ddb_url``), ``repeats`` turns each after ``warmup`` turns. With ``server`` (a
    :class:`~benchmarks.canned.CannedKinesisServer`), each reader's Kinesis calls of the last turn
    are counted too. With ``quotas``, every reader's turn reads through a new quota-enforcing
    proxy (``tests/support/quota.py``: each starts with full buckets), which counts its refusals.

    Each turn also measures the client's CPU: the raw loop's process, and for the Spark readers
    every client process (:mod:`benchmarks.client_cpu`), from ``start()`` to the last row; as
    CPU seconds per GiB of record data delivered, beside :func:`raw_loop.decode_floor`'s."""
    records = sum(per_shard.values())
    data_gib = records * size / raw_loop.GIB
    rates: dict[str, list[float]] = {"raw_boto3": [], "naive": [], "kinesis_ddb": []}
    walls: dict[str, list[float]] = {"naive": [], "kinesis_ddb": []}
    cpu: dict[str, list[float]] = {k: [] for k in rates}
    net: dict[str, list[float]] = {"raw_boto3": [], "kinesis_ddb": []}
    api_cpu: list[float] = []
    refused: dict[str, list[int]] = {k: [] for k in rates}
    phases: list[dict[str, float]] = []
    batches: list[int] = []
    calls: dict[str, dict[str, int]] = {}
    meter = ClientCpu()

    def counted(name: str, fn: Any) -> Any:
        if server is not None:
            server.reset_stats()
        with (QuotaProxy(url) if quotas else contextlib.nullcontext()) as proxy:
            out = fn(proxy.url if proxy is not None else url)
            refused[name].append(proxy.refused() if proxy is not None else 0)
        if server is not None:
            calls[name] = server.stats()
        return out

    def spark_read(fmt: str, options: dict[str, str]) -> dict[str, Any]:
        with meter.window() as used:
            out = spark_env.read_backlog(spark, fmt, options, records)
        return {**out, "cpu_seconds": used[0].total}

    for turn in range(repeats + warmup):
        raw = counted("raw_boto3", lambda u: raw_loop.run(u, stream, per_shard))
        naive = counted("naive", lambda u: spark_read("kinesis-naive", {
            "streamName": stream, "endpointUrl": u, "region": REGION,
            "accessKeyId": ACCESS_KEYS["naive"]}))
        ours = counted("kinesis_ddb", lambda u: spark_read(
            "kinesis-ddb", source_options(u, stream, dynamodbEndpointUrl=ddb_url, **TABLE)))
        with meter.window() as api:
            spark_env.one_batch(spark, "python-floor",
                                {"numPartitions": str(spark_env.tasks_for(spark, len(per_shard)))})
        if turn < warmup:
            for k in refused:
                refused[k].pop()
            continue
        phases.append(ours["phases"])
        batches.append(ours["batches"])
        rates["raw_boto3"].append(records / raw["seconds"])
        rates["naive"].append(records / naive["seconds"])
        rates["kinesis_ddb"].append(records / ours["seconds"])
        walls["naive"].append(records / naive["wall_seconds"])
        walls["kinesis_ddb"].append(records / ours["wall_seconds"])
        cpu["raw_boto3"].append(raw["process_cpu_seconds"] / data_gib)
        for name, got in (("naive", naive), ("kinesis_ddb", ours)):
            cpu[name].append(got["cpu_seconds"] / data_gib)
        api_cpu.append(api[0].total)
        net["raw_boto3"].append(raw["cpu_seconds"] / data_gib)
        net["kinesis_ddb"].append((ours["cpu_seconds"] - api[0].total) / data_gib)
    floor = raw_loop.decode_floor(raw_loop.raw_pages(url, stream, per_shard))
    s = {k: summary(v) for k, v in rates.items()}
    out = {
        "shards": len(per_shard),
        "record_bytes": size,
        "records": records,
        "rps": s,
        "rps_with_query_start": {k: summary(v) for k, v in walls.items()},
        "kinesis_ddb_phase_seconds": {
            k: summary(p.get(k, 0.0) for p in phases)["median"] for k in phases[0]
        },
        "kinesis_ddb_batches": summary(batches)["median"],
        "ratio_vs_raw": s["kinesis_ddb"]["median"] / s["raw_boto3"]["median"],
        "ratio_vs_naive": s["kinesis_ddb"]["median"] / s["naive"]["median"],
        "quotas": quotas,
        "refused": {k: summary(v) for k, v in refused.items()},
        "cpu_s_per_gib": {k: summary(v) for k, v in cpu.items()},
        # without each reader's start: the raw loop's reading alone, kinesis-ddb's less the API's
        "net_cpu_s_per_gib": {k: summary(v) for k, v in net.items()},
        "api_query_cpu_s": summary(api_cpu),
        "floor_cpu_s_per_gib": floor["cpu_s_per_gib"],
    }
    if calls:
        out["kinesis_calls_last_turn"] = calls
    return out


def _print(label: str, r: dict[str, Any]) -> None:
    print(
        f"  {label} {r['shards']} shards {r['record_bytes']:>5} B: raw boto3 "
        f"{describe(r['rps']['raw_boto3'])}; naive {describe(r['rps']['naive'])}; kinesis-ddb "
        f"{describe(r['rps']['kinesis_ddb'])} rec/s; x raw {r['ratio_vs_raw']:.2f}, "
        f"x naive {r['ratio_vs_naive']:.2f}",
        flush=True,
    )


def run_suite(spark: Any, url: str, quick: bool, quotas: bool = True) -> list[dict[str, Any]]:
    """Every shard count and record size on moto (behind quota proxies unless not ``quotas``),
    printed as it goes."""
    records, repeats = (2000, 3) if quick else (32000, 3)
    out = []
    first = True
    for shards in SHARD_COUNTS:
        for size in RECORD_SIZES:
            if quotas:
                records = shards * QUOTA_PER_SHARD["moto", size] // (10 if quick else 1)
            # The session's first queries start Spark's Python workers and warm the JVM.
            r = measure(spark, url, shards, size, records, repeats, warmup=1 if first else 0,
                        quotas=quotas)
            first = False
            _print("e2e", r)
            out.append(r)
    return out


def run_canned_suite(
    spark: Any, ddb_url: str, quick: bool, latency: float = CANNED_LATENCY_S, quotas: bool = True
) -> dict[str, Any]:
    """Every shard count and record size on the canned Kinesis server (``latency`` seconds per
    request; behind quota proxies unless not ``quotas``), DynamoDB on moto at ``ddb_url``;
    printed as it goes."""
    records, repeats = CANNED_SIZES[quick]

    def per_shard(shards: int, size: int) -> int:
        if quotas:
            return QUOTA_PER_SHARD["canned", size] // (10 if quick else 1)
        return records // shards

    specs = {
        (shards, size): StreamSpec(f"e2e-canned-{shards}-{size}", shards, per_shard(shards, size), size)
        for shards in SHARD_COUNTS
        for size in RECORD_SIZES
    }
    rows = []
    with CannedKinesisServer(list(specs.values()), latency) as server:
        first = True
        for (_shards, size), spec in specs.items():
            # The suite's first queries start Spark's Python workers and warm the JVM (again
            # when the moto suite ran before: cheap, and the suite stays the same run alone).
            r = measure_readers(
                spark, server.url, ddb_url, spec.name, spec.per_shard(), size, repeats,
                warmup=1 if first else 0, server=server, quotas=quotas,
            )
            first = False
            _print(f"e2e canned {latency * 1000:.0f} ms", r)
            rows.append(r)
    return {"latency_ms": latency * 1000, "records": records, "rows": rows, "quotas": quotas}


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--canned", action="store_true",
                        help="only the canned server's part (DynamoDB on moto)")
    parser.add_argument("--latency", type=float, default=CANNED_LATENCY_S,
                        help="the canned server's seconds per request")
    parser.add_argument("--no-quotas", action="store_true",
                        help="no quota proxy: every reader straight to the server (the old reference)")
    args = parser.parse_args()
    local_env()
    with LocalEndpoint() as ep:
        spark = spark_env.session()
        try:
            if args.canned:
                run_canned_suite(spark, ep.url, args.quick, args.latency, not args.no_quotas)
            else:
                run_suite(spark, ep.url, args.quick, not args.no_quotas)
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
