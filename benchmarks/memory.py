"""Memory: the executor read path's RSS while it reads one 1M-record range.

A child process runs what ``read()`` runs (``RangeReader`` + ``records.user_records`` +
``records.to_record_batch``, over the source's own shared boto3 client) through real HTTP against
the canned Kinesis server of ``canned.py``, dropping each Arrow batch as Spark would after sending
it, and samples its own RSS (``/proc/self/statm``) after every page. Growth is the peak less the
RSS after the first page (clients made, first buffers allocated): it must stay flat, as records
stream page by page and a range is never buffered whole.

Why a canned server: moto's PutRecord looks up the shard's last sequence number by listing all of
its keys, so 1M records in one shard would take hours to put.

    python -m benchmarks.memory [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

from benchmarks.canned import CannedKinesisServer, StreamSpec, seq_of, shard_id
from benchmarks.common import describe, summary

RECORD_BYTES = 100
STREAM, SHARD = "memory", shard_id(0)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(url: str, records: int) -> dict[str, Any]:
    """Read the whole range as an executor does; RSS samples and rows read."""
    import time

    from benchmarks.common import settings
    from kinesis_source.aws.clients import shared_client
    from kinesis_source.executor.arrow import to_record_batch, user_records
    from kinesis_source.executor.polling import RangeReader
    from kinesis_source.positions import Position, ShardRange

    rng = ShardRange(STREAM, SHARD, Position.trim_horizon(), str(seq_of(0, records - 1)))
    start_rss = _rss_bytes()
    client = shared_client(settings(url), "kinesis")
    samples, rows = [], 0
    began = time.perf_counter()
    for page in RangeReader(client, rng, 10000).pages():
        batch = to_record_batch(rng.stream, rng.shard_id, user_records(page, rng, "fail"))
        rows += batch.num_rows
        del batch, page  # Spark sends a batch on and forgets it
        samples.append(_rss_bytes())
    return {
        "rows": rows,
        "seconds": time.perf_counter() - began,
        "rss_start": start_rss,
        "rss_after_first_page": samples[0],
        "rss_peak": max(samples),
        "rss_end": samples[-1],
        "pages": len(samples),
    }


def measure(records: int, repeats: int) -> dict[str, Any]:
    """``repeats`` child processes each reading the range."""
    runs = []
    with CannedKinesisServer([StreamSpec(STREAM, 1, records, RECORD_BYTES)]) as server:
        for _ in range(repeats):
            out = subprocess.run(
                [sys.executable, "-m", "benchmarks.memory", "--child", server.url, str(records)],
                capture_output=True, text=True, check=True, timeout=900,
            )
            run = json.loads(out.stdout.strip().splitlines()[-1])
            assert run["rows"] == records, run
            runs.append(run)
    mib = 1024 * 1024
    return {
        "records": records,
        "record_bytes": RECORD_BYTES,
        "growth_mib": summary((r["rss_peak"] - r["rss_after_first_page"]) / mib for r in runs),
        "rss_after_first_page_mib": summary(r["rss_after_first_page"] / mib for r in runs),
        "rss_peak_mib": summary(r["rss_peak"] / mib for r in runs),
        "records_per_second": summary(records / r["seconds"] for r in runs),
    }


def run_suite(quick: bool) -> dict[str, Any]:
    """One range of 1M records (100k with ``quick``), printed."""
    r = measure(100_000 if quick else 1_000_000, 3)
    print(
        f"  memory {r['records']:,} records: RSS growth {describe(r['growth_mib'], ' MiB', 1)} "
        f"(after first page {r['rss_after_first_page_mib']['median']:.0f} MiB, peak "
        f"{r['rss_peak_mib']['median']:.0f} MiB), {describe(r['records_per_second'])} rec/s",
        flush=True,
    )
    return r


def main() -> None:
    """Command-line entry point (``--child URL N`` is the measured process)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("URL", "RECORDS"))
    args = parser.parse_args()
    if args.child:
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        print(json.dumps(child(args.child[0], int(args.child[1]))))
        return
    run_suite(args.quick)


if __name__ == "__main__":
    main()
