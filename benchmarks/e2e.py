"""End to end on a local server (moto): a fixed backlog on 4 and 8 shards (100 B and 1 KB
records) read by a Spark query into the ``noop`` sink, records/s, against two baselines in the
same run on the same streams:

- (a) a raw boto3 ``GetRecords`` loop, one thread per shard (no Spark: the client floor);
- (b) the naive driver-side ``SimpleDataSourceStreamReader`` of ``benchmarks/naive.py``.

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

    python -m benchmarks.e2e [--quick] [--canned [--latency 0.02]]
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import boto3

from benchmarks import spark_env
from benchmarks.canned import CannedKinesisServer, StreamSpec
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

SHARD_COUNTS = (4, 8)
RECORD_SIZES = (100, 1024)
PAGE_LIMIT = 10000
# One checkpoint table for every query, made by the warm-up, so no measured batch creates it.
TABLE = {"checkpointTable": "kinesis-ddb-bench-e2e"}
# Per-request latency of the canned server: a GetRecords round trip to AWS within a region.
CANNED_LATENCY_S = 0.020
# (records per stream, repeats) on the canned server, by --quick.
CANNED_SIZES = {True: (8000, 3), False: (96000, 3)}


def raw_loop(url: str, stream: str, per_shard: dict[str, int]) -> float:
    """Seconds for one thread per shard to read every shard's backlog with plain boto3."""
    client = boto3.client("kinesis", endpoint_url=url, region_name=REGION)
    counts: dict[str, int] = {}

    def read(shard: str) -> None:
        it = client.get_shard_iterator(
            StreamName=stream, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        got = 0
        while got < per_shard[shard]:
            page = client.get_records(ShardIterator=it, Limit=PAGE_LIMIT)
            got += len(page["Records"])
            it = page["NextShardIterator"]
        counts[shard] = got

    threads = [threading.Thread(target=read, args=(s,)) for s in per_shard]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    assert counts == per_shard, (counts, per_shard)
    return elapsed


def measure(
    spark: Any, url: str, shards: int, size: int, records: int, repeats: int, warmup: int = 0
) -> dict[str, Any]:
    """The three readers on a new moto stream holding ``records`` records of ``size`` bytes."""
    client = boto3.client("kinesis", endpoint_url=url, region_name=REGION)
    stream = create_stream(client, shards, "e2e")
    per_shard = fill_backlog(client, stream, records, size)
    return measure_readers(spark, url, url, stream, per_shard, size, repeats, warmup)


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
) -> dict[str, Any]:
    """The three readers on one backlog (Kinesis at ``url``, kinesis-ddb's checkpoints in
    DynamoDB at ``ddb_url``), ``repeats`` turns each after ``warmup`` turns. With ``server`` (a
    :class:`~benchmarks.canned.CannedKinesisServer`), each reader's Kinesis calls of the last turn
    are counted too."""
    records = sum(per_shard.values())
    rates: dict[str, list[float]] = {"raw_boto3": [], "naive": [], "kinesis_ddb": []}
    walls: dict[str, list[float]] = {"naive": [], "kinesis_ddb": []}
    phases: list[dict[str, float]] = []
    batches: list[int] = []
    calls: dict[str, dict[str, int]] = {}

    def counted(name: str, fn: Any) -> Any:
        if server is not None:
            server.reset_stats()
        out = fn()
        if server is not None:
            calls[name] = server.stats()
        return out

    for turn in range(repeats + warmup):
        raw = records / counted("raw_boto3", lambda: raw_loop(url, stream, per_shard))
        naive = counted("naive", lambda: spark_env.read_backlog(
            spark, "kinesis-naive", {"streamName": stream, "endpointUrl": url, "region": REGION},
            records,
        ))
        ours = counted("kinesis_ddb", lambda: spark_env.read_backlog(
            spark, "kinesis-ddb",
            source_options(url, stream, dynamodbEndpointUrl=ddb_url, **TABLE), records,
        ))
        if turn >= warmup:
            phases.append(ours["phases"])
            batches.append(ours["batches"])
            rates["raw_boto3"].append(raw)
            rates["naive"].append(records / naive["seconds"])
            rates["kinesis_ddb"].append(records / ours["seconds"])
            walls["naive"].append(records / naive["wall_seconds"])
            walls["kinesis_ddb"].append(records / ours["wall_seconds"])
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


def run_suite(spark: Any, url: str, quick: bool) -> list[dict[str, Any]]:
    """Every shard count and record size on moto, printed as it goes."""
    records, repeats = (2000, 3) if quick else (32000, 3)
    out = []
    first = True
    for shards in SHARD_COUNTS:
        for size in RECORD_SIZES:
            # The session's first queries start Spark's Python workers and warm the JVM.
            r = measure(spark, url, shards, size, records, repeats, warmup=1 if first else 0)
            first = False
            _print("e2e", r)
            out.append(r)
    return out


def run_canned_suite(
    spark: Any, ddb_url: str, quick: bool, latency: float = CANNED_LATENCY_S
) -> dict[str, Any]:
    """Every shard count and record size on the canned Kinesis server (``latency`` seconds per
    request), DynamoDB on moto at ``ddb_url``; printed as it goes."""
    records, repeats = CANNED_SIZES[quick]
    specs = {
        (shards, size): StreamSpec(f"e2e-canned-{shards}-{size}", shards, records // shards, size)
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
                warmup=1 if first else 0, server=server,
            )
            first = False
            _print(f"e2e canned {latency * 1000:.0f} ms", r)
            rows.append(r)
    return {"latency_ms": latency * 1000, "records": records, "rows": rows}


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--canned", action="store_true",
                        help="only the canned server's part (DynamoDB on moto)")
    parser.add_argument("--latency", type=float, default=CANNED_LATENCY_S,
                        help="the canned server's seconds per request")
    args = parser.parse_args()
    local_env()
    with LocalEndpoint() as ep:
        spark = spark_env.session()
        try:
            if args.canned:
                run_canned_suite(spark, ep.url, args.quick, args.latency)
            else:
                run_suite(spark, ep.url, args.quick)
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
