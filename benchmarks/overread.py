"""Over-reading (issue 17): the bytes executors read against the bytes of the records in their
ranges, at ``BYTES_PER_S`` per shard, on moto behind the quota-enforcing proxy.

A Spark streaming query (default trigger and options but endpoints and credentials,
``initialPosition=LATEST``, ``noop`` sink) reads ``SHARDS`` shards while a feeder writes
``RECORD_BYTES``-byte records to every shard at ``BYTES_PER_S``. After ``MEASURE_S`` the feeder
stops and the query reads on until it has every record fed. Counted on the proxy, by caller: the
data bytes (and partition keys, as Kinesis counts them) of every ``GetRecords`` answer to the
executors (boto3) and to the driver (aiobotocore), against the bytes of every record fed (each
is in exactly one range). The source's own figures (``executorBytesRead``, ``executorBytesExtra``
from its progress report) are shown beside them.

    python -m benchmarks.overread [--quick]
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from typing import Any

import boto3
from botocore.config import Config

from benchmarks.common import REGION, create_stream, source_options
from benchmarks.overhead import _report
from benchmarks.quota import _rows_read, _shard_ids, _start, _wait
from tests.support.quota import Feeder, QuotaProxy

SHARDS = 4
RECORD_BYTES = 10_000
BYTES_PER_S = 1_000_000  # per shard
ROUNDS_PER_S = 10  # PutRecords calls a second, each with a tenth of a second of every shard's records
PARTITION_KEY = "k"  # the Feeder's
FIRST_BATCH_TIMEOUT_S = 120.0
CATCH_UP_TIMEOUT_S = 120.0


def measure(spark: Any, url: str, measure_s: float) -> dict[str, Any]:
    """One query on a new stream; see the module docstring."""
    client = boto3.client("kinesis", endpoint_url=url, region_name=REGION,
                          config=Config(retries={"mode": "standard", "max_attempts": 10}))
    stream = create_stream(client, SHARDS, "overread")
    shards = _shard_ids(client, stream)
    checkpoint = tempfile.mkdtemp(prefix="kddb-overread-")
    with QuotaProxy(url) as quota:
        options = source_options(quota.url, stream, initialPosition="LATEST")
        options["dynamodbEndpointUrl"] = url
        key = options["awsAccessKeyId"]
        query = _start(spark, options, checkpoint)
        try:
            _wait(lambda: bool(query.recentProgress), FIRST_BATCH_TIMEOUT_S, "the query's first batch", query)
            per_round = max(1, BYTES_PER_S // RECORD_BYTES // ROUNDS_PER_S)
            with Feeder(client, stream, shards, ROUNDS_PER_S, RECORD_BYTES, per_round) as feeder:
                time.sleep(measure_s)  # the measured window: the query runs, nothing is awaited
            fed = len(feeder.sent)
            _wait(lambda: _rows_read(query) >= fed, CATCH_UP_TIMEOUT_S, f"every record fed ({fed})", query)
            rows = _rows_read(query)
            progress = [json.loads(p.json) for p in query.recentProgress]
        finally:
            query.stop()
            shutil.rmtree(checkpoint, ignore_errors=True)
        by = quota.bytes_read_by
        executors = sum(v for (k, kind, s, _), v in by.items() if k == key and kind == "sync" and s == stream)
        driver = sum(v for (k, kind, s, _), v in by.items() if k == key and kind == "async" and s == stream)
    ranges = fed * (RECORD_BYTES + len(PARTITION_KEY))
    stats = _report(progress[-1]) if progress else {}
    return {
        "shards": SHARDS,
        "bytes_per_second_per_shard": BYTES_PER_S,
        "record_bytes": RECORD_BYTES,
        "seconds_fed": measure_s,
        "records_fed": fed,
        "rows_read": rows,
        "range_bytes": ranges,
        "executor_bytes": executors,
        "driver_bytes": driver,
        "executor_ratio": executors / ranges if ranges else 0.0,
        "driver_ratio": driver / ranges if ranges else 0.0,
        "reported_read_bytes": stats.get("executorBytesRead", 0),
        "reported_extra_bytes": stats.get("executorBytesExtra", 0),
        "batches": sum(1 for p in progress if p["numInputRows"] > 0),
    }


def run_suite(spark: Any, url: str, quick: bool) -> dict[str, Any]:
    """The one case, printed."""
    r = measure(spark, url, 20.0 if quick else 60.0)
    _print(r)
    return r


def _print(r: dict[str, Any]) -> None:
    print(
        f"  overread {r['shards']} shards at {r['bytes_per_second_per_shard'] / 1e6:g} MB/s each: executors read "
        f"{r['executor_bytes']:,} B for {r['range_bytes']:,} B of ranges = {r['executor_ratio']:.3f}x; driver "
        f"{r['driver_bytes']:,} B = {r['driver_ratio']:.3f}x; {r['records_fed']:,} fed, {r['rows_read']:,} read in "
        f"{r['batches']} batches; reported extra {r['reported_extra_bytes']:,} of {r['reported_read_bytes']:,} B",
        flush=True,
    )


def main() -> None:
    """Command-line entry point."""
    from benchmarks import spark_env

    spark_env.suite_main(__doc__, run_suite)


if __name__ == "__main__":
    main()
