"""Planning: what ``latestOffset`` costs on the driver for 10, 100 and 1,000 shards (moto server).

``kinesis_source.driver.planner.Planner.latest_offset`` (the code ``latestOffset`` runs) is timed in its
steady state (listing done, continuation iterators kept from the previous probe) for shards with
no new data and for shards that each received ``rounds`` new records (one per shard per round,
1 KB, as a steady producer writes them). For each: wall time, the driver's CPU time, calls, and
the bytes of the driver's Kinesis responses; the batch's bytes are those of the executors'
responses when its ranges are read with ``RangeReader`` (once per case; the probe's end is
checked to be the last record put in every shard). A second case, ``sustained``, is a batch of many
records per shard: the probe
reads a few records per shard whatever the batch's size, so its share shrinks as batches grow.

    python -m benchmarks.planning [--quick]
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks.common import (
    create_stream,
    describe,
    local_env,
    put_rounds,
    settings,
    shard_hash_keys,
    source_options,
    summary,
)
from kinesis_source.aws.clients import shared_client
from kinesis_source.driver.planner import Planner, plan_ranges
from kinesis_source.executor.polling import RangeReader
from kinesis_source.options import SourceOptions
from kinesis_source.positions import Offset, Position, ShardId
from kinesis_source.tools.local import LocalEndpoint

SHARD_COUNTS = (10, 100, 1000)
RECORD_BYTES = 1024


class ByteMeter:
    """Counts response bytes and calls of botocore/aiobotocore clients (``after-call`` hook)."""

    def __init__(self) -> None:
        self.bytes = 0
        self.calls = 0

    def attach(self, client: Any) -> None:
        """Count every call ``client`` makes from now on."""
        client.meta.events.register("after-call.kinesis.*", self._seen)

    def _seen(self, http_response: Any, **_: Any) -> None:
        # aiobotocore's response keeps the body read in ``_content``; botocore's too.
        body = getattr(http_response, "_content", None)
        self.bytes += len(body) if body is not None else int(http_response.headers.get("content-length", 0))
        self.calls += 1


def _planner(url: str, stream: str) -> tuple[Planner, ByteMeter]:
    opts = SourceOptions.parse(
        source_options(
            url,
            stream,
            minProbeIntervalMs="0",  # every call probes: we time probes, not the throttle
            shardDiscoveryIntervalMs="3600000",  # ListShards is timed apart (warm-up)
        )
    )
    planner = Planner(opts)
    meter = ByteMeter()
    meter.attach(planner.kinesis().client)  # made now, so the meter sees every call
    return planner, meter


def _batch_bytes(url: str, start: Offset, end: Offset) -> tuple[int, int]:
    """(records, response bytes) the executors read for the batch ``start``..``end``."""
    client = settings(url).boto3_client("kinesis")
    meter = ByteMeter()
    meter.attach(client)

    def read(rng: Any) -> int:
        return sum(len(page) for page in RangeReader(client, rng, 10000).pages())

    with ThreadPoolExecutor(8) as pool:
        records = sum(pool.map(read, plan_ranges(start, end)))
    return records, meter.bytes


def _probe(planner: Planner, meter: ByteMeter, start: Offset) -> tuple[Offset, dict[str, float]]:
    calls, fetched, size = meter.calls, planner.stats()["driverRecordsFetched"], meter.bytes
    wall, cpu = time.perf_counter(), time.process_time()
    end = planner.latest_offset(start)
    figures = {
        "seconds": time.perf_counter() - wall,
        "cpu_seconds": time.process_time() - cpu,
        "calls": meter.calls - calls,
        "records": planner.stats()["driverRecordsFetched"] - fetched,
        "bytes": meter.bytes - size,
    }
    return end, figures


def measure(url: str, shards: int, rounds: int, repeats: int) -> dict[str, Any]:
    """Idle and new-data probes of one stream, ``repeats`` times after a warm-up."""
    kinesis = shared_client(settings(url), "kinesis")
    stream = create_stream(kinesis, shards, "plan")
    keys = shard_hash_keys(kinesis, stream)
    last = put_rounds(kinesis, stream, 1, RECORD_BYTES, keys)
    start = Offset({ShardId(stream, s): Position.after(seq) for s, seq in last.items()})
    planner, meter = _planner(url, stream)
    try:
        planner.latest_offset(start)  # warm-up: ListShards and the first iterators
        idle, new = [], []
        for rep in range(repeats + 1):
            end, f_idle = _probe(planner, meter, start)
            assert end == start, "an idle probe moved"
            last = put_rounds(kinesis, stream, rounds, RECORD_BYTES, keys)
            end, f_new = _probe(planner, meter, start)
            expected = {ShardId(stream, s): Position.after(seq) for s, seq in last.items()}
            assert dict(end.shards) == expected, "the probe missed the tip"
            if rep == repeats:  # read once: a batch's bytes do not vary between repeats
                f_new["batch_records"], f_new["batch_bytes"] = _batch_bytes(url, start, end)
                assert f_new["batch_records"] == rounds * shards
            if rep:
                idle.append(f_idle)
                new.append(f_new)
            start = end
    finally:
        planner.close()
    return {
        "shards": shards,
        "rounds": rounds,
        "record_bytes": RECORD_BYTES,
        "idle": _collect(idle),
        "new_data": _collect(new),
    }


def _collect(runs: list[dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {k: summary(r[k] for r in runs) for k in ("seconds", "cpu_seconds")}
    for key in ("calls", "records", "bytes", "batch_records", "batch_bytes"):
        values = [r[key] for r in runs if key in r]
        if values:
            out[key] = summary(values)["median"]
    if "batch_bytes" in out:
        out["probe_pct_of_batch"] = 100.0 * out["bytes"] / out["batch_bytes"]
    return out


def run_suite(url: str, quick: bool) -> dict[str, Any]:
    """Every shard count and the sustained case, printed as it goes."""
    repeats = 3
    rounds, sustained_rounds = (5, 100) if quick else (20, 500)
    cases = []
    for shards in SHARD_COUNTS:
        r = measure(url, shards, rounds, repeats)
        _print(r)
        cases.append(r)
    sustained = measure(url, 10, sustained_rounds, repeats)
    _print(sustained, "sustained ")
    t10 = cases[0]["new_data"]["seconds"]["median"]
    t1000 = cases[-1]["new_data"]["seconds"]["median"]
    i10 = cases[0]["idle"]["seconds"]["median"]
    i1000 = cases[-1]["idle"]["seconds"]["median"]
    return {
        "cases": cases,
        "sustained": sustained,
        "ratio_1000_over_10_new_data": t1000 / t10,
        "ratio_1000_over_10_idle": i1000 / i10,
    }


def _print(r: dict[str, Any], label: str = "") -> None:
    n, i = r["new_data"], r["idle"]
    print(
        f"  planning {label}{r['shards']:>5} shards: idle {describe(i['seconds'], ' s', 3)} "
        f"{i['calls']:.0f} calls {i['bytes']:,.0f} B; new data ({r['rounds']}/shard) "
        f"{describe(n['seconds'], ' s', 3)} cpu {n['cpu_seconds']['median']:.3f} s "
        f"{n['calls']:.0f} calls {n['records']:.0f} records {n['bytes']:,.0f} B = "
        f"{n['probe_pct_of_batch']:.2f}% of batch {n['batch_bytes']:,.0f} B",
        flush=True,
    )


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    local_env()
    with LocalEndpoint() as ep:
        run_suite(ep.url, args.quick)


if __name__ == "__main__":
    main()
