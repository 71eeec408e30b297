"""End to end on a local server (moto): a fixed backlog on 4 and 8 shards (100 B and 1 KB
records) read by a Spark query into the ``noop`` sink, records/s, against two baselines in the
same run on the same streams:

- (a) a raw boto3 ``GetRecords`` loop, one thread per shard (no Spark: the client floor);
- (b) the naive driver-side ``SimpleDataSourceStreamReader`` of ``benchmarks/naive.py``.

The three readers take turns within each repeat, so a slow moment of the machine hits them alike.
A Spark reader's time is the ``triggerExecution`` time of the batches that read the backlog (the
one-time query start is reported apart, as ``rps_with_query_start``); one warm-up turn of each
reader runs first and is not counted.

    python -m benchmarks.e2e [--quick]
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import boto3

from benchmarks import spark_env
from benchmarks.common import (
    REGION,
    create_stream,
    describe,
    fill_backlog,
    local_env,
    source_options,
    summary,
)
from kinesis_source.local import LocalEndpoint

SHARD_COUNTS = (4, 8)
RECORD_SIZES = (100, 1024)
PAGE_LIMIT = 10000
# One checkpoint table for every query, made by the warm-up, so no measured batch creates it.
TABLE = {"checkpointTable": "kinesis-ddb-bench-e2e"}


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
    """The three readers on one backlog, ``repeats`` turns each after ``warmup`` turns."""
    client = boto3.client("kinesis", endpoint_url=url, region_name=REGION)
    stream = create_stream(client, shards, "e2e")
    per_shard = fill_backlog(client, stream, records, size)
    rates: dict[str, list[float]] = {"raw_boto3": [], "naive": [], "kinesis_ddb": []}
    walls: dict[str, list[float]] = {"naive": [], "kinesis_ddb": []}
    phases: list[dict[str, float]] = []
    for turn in range(repeats + warmup):
        raw = records / raw_loop(url, stream, per_shard)
        naive = spark_env.read_backlog(
            spark, "kinesis-naive", {"streamName": stream, "endpointUrl": url, "region": REGION},
            records,
        )
        ours = spark_env.read_backlog(
            spark, "kinesis-ddb", source_options(url, stream, **TABLE), records
        )
        if turn >= warmup:
            phases.append(ours["phases"])
            rates["raw_boto3"].append(raw)
            rates["naive"].append(records / naive["seconds"])
            rates["kinesis_ddb"].append(records / ours["seconds"])
            walls["naive"].append(records / naive["wall_seconds"])
            walls["kinesis_ddb"].append(records / ours["wall_seconds"])
    s = {k: summary(v) for k, v in rates.items()}
    return {
        "shards": shards,
        "record_bytes": size,
        "records": records,
        "rps": s,
        "rps_with_query_start": {k: summary(v) for k, v in walls.items()},
        "kinesis_ddb_phase_seconds": {
            k: summary(p.get(k, 0.0) for p in phases)["median"] for k in phases[0]
        },
        "ratio_vs_raw": s["kinesis_ddb"]["median"] / s["raw_boto3"]["median"],
        "ratio_vs_naive": s["kinesis_ddb"]["median"] / s["naive"]["median"],
    }


def run_suite(spark: Any, url: str, quick: bool) -> list[dict[str, Any]]:
    """Every shard count and record size, printed as it goes."""
    records, repeats = (2000, 3) if quick else (32000, 3)
    out = []
    first = True
    for shards in SHARD_COUNTS:
        for size in RECORD_SIZES:
            # The session's first queries start Spark's Python workers and warm the JVM.
            r = measure(spark, url, shards, size, records, repeats, warmup=1 if first else 0)
            first = False
            print(
                f"  e2e {shards} shards {size:>5} B: raw boto3 {describe(r['rps']['raw_boto3'])}; "
                f"naive {describe(r['rps']['naive'])}; kinesis-ddb "
                f"{describe(r['rps']['kinesis_ddb'])} rec/s; x raw {r['ratio_vs_raw']:.2f}, "
                f"x naive {r['ratio_vs_naive']:.2f}",
                flush=True,
            )
            out.append(r)
    return out


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    local_env()
    with LocalEndpoint() as ep:
        spark = spark_env.session()
        try:
            run_suite(spark, ep.url, args.quick)
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
