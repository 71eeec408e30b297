"""The soak (issue 19, item 5): a long run of steady writes with periodic reshards and driver
kills, recording the resources of every process of the query over time. Opt-in, not in CI:

    ./dev soak [--minutes 30] [--kill-every 10] [--reshard-every 60] [--backend kinesis-local]
               [--out DIR]

- a producer writes 40 records/s (bursts of 20 every 0.5 s, 16 partition keys) to a stream of
  2 shards on kinesis-local (default; it reshards as Kinesis does) or moto (whose PutRecords
  keeps writing a split parent, so its children stay empty);
- a thread splits and merges shards every ``--reshard-every`` seconds (2 to 4 open);
- every ``--kill-every`` minutes the driver (Spark JVM, the source's planning helper, the
  executors' Python workers) is SIGKILLed and restarted, keeping and dropping the Spark
  checkpoint in turn; the sink is the chaos suite's (a delivery file per batch and the
  exactly-once SQLite recipe);
- every 10 s: RSS and open file descriptors of the driver's Python process, the source's
  planning helper (``python_streaming_source_runner``), the executors' Python workers
  (``pyspark.daemon`` and its forks) and the JVM; batches run; DynamoDB items written (counted
  on a proxy in front of DynamoDB);
- at the end the producer stops, the last run drains, and lost / duplicated / out-of-order (per
  shard and per partition key) records are counted.

Writes ``DIR/soak.json`` (every sample and the totals) and prints a markdown table: per minute,
and per run the growth from the end of its warm-up (``--warmup`` minutes) to its last sample.
Exit status 1 if a record was lost, invented or out of order.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import boto3

from kinesis_source.tools.local import LOCAL_CREDENTIALS, LocalEndpoint
from tests.chaos.driver import ChaosDriver
from tests.chaos.harness import BackgroundProducer
from tests.chaos.recipe import sink_records
from tests.chaos.resharder import Resharder
from tests.support.checker import check, key_order_violations, load_deliveries
from tests.support.kinesis_local import KinesisLocal
from tests.support.proxy import FaultProxy, Seen
from tests.support.waiting import wait_for

KINDS = ("driver", "planner", "workers", "jvm")


class DynamoWrites(FaultProxy):
    """A proxy in front of DynamoDB that counts the items each write call writes."""

    def __init__(self, target_url: str) -> None:
        super().__init__(target_url)
        self.items = 0
        self.calls = 0

    def _describe(self, call: Seen, body: bytes) -> Seen:
        op = call.operation
        if op in ("PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem"):
            req = json.loads(body or b"{}")
            n = (len(req.get("TransactItems", ())) if op == "TransactWriteItems"
                 else sum(len(v) for v in req.get("RequestItems", {}).values()) if op == "BatchWriteItem" else 1)
            with self._lock:
                self.items += n
                self.calls += 1
        return call


def _kind(cmdline: list[str]) -> str | None:
    text = " ".join(cmdline)
    if "python_streaming_source_runner" in text:
        return "planner"
    if "pyspark.daemon" in text or "pyspark.worker" in text:
        return "workers"
    if "tests.chaos.driver" in text:
        return "driver"
    if cmdline and cmdline[0].endswith("java"):
        return "jvm"
    return None


def _processes() -> dict[int, int]:
    """pid -> parent pid, for every process."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue  # ended while read
    return parents


def sample_tree(root: int) -> dict[str, dict[str, float]]:
    """RSS (MiB), open file descriptors and process count per kind, over ``root`` and its
    descendants (a tree, not the process group: Spark's Python daemon makes a group of its own)."""
    parents = _processes()
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, pp in parents.items() if pp == parent and pid not in tree]
        tree.update(children)
        frontier += children
    out: dict[str, dict[str, float]] = {k: {"rss_mib": 0.0, "fds": 0, "procs": 0} for k in KINDS}
    for pid in tree:
        try:
            kind = _kind(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0"))
            if kind is None:
                continue
            rss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                       if line.startswith("VmRSS:"))
            fds = len(os.listdir(f"/proc/{pid}/fd"))
        except (OSError, StopIteration, ValueError, IndexError):
            continue  # the process ended while read
        out[kind]["rss_mib"] += rss / 1024
        out[kind]["fds"] += fds
        out[kind]["procs"] += 1
    return out


def batches_of(out: Path, run: str) -> set[int]:
    path = out / f"{run}.progress.jsonl"
    try:
        return {json.loads(line)["batchId"] for line in path.read_text().splitlines() if line}
    except (OSError, ValueError):
        return set()


def soak(args: argparse.Namespace) -> dict[str, Any]:
    """Run the soak; returns the samples and totals (also written to ``out/soak.json``)."""
    out = Path(args.out or tempfile.mkdtemp(prefix="kddb-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    os.environ.update(LOCAL_CREDENTIALS)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    rng = random.Random(args.seed)
    with LocalEndpoint() as ep, DynamoWrites(ep.url) as writes:
        kl = KinesisLocal().start() if args.backend == "kinesis-local" else None
        try:
            return _run(args, out, rng, ep.url if kl is None else kl.url, ep.url, writes)
        finally:
            if kl is not None:
                kl.stop()


def _run(args, out: Path, rng: random.Random, kinesis_url: str, ddb_url: str, writes: DynamoWrites) -> dict:
    kinesis = boto3.client("kinesis", endpoint_url=kinesis_url, region_name="us-east-1")
    stream = f"soak-{rng.randrange(10**8)}"
    kinesis.create_stream(StreamName=stream, ShardCount=2)
    wait_for(lambda: kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"][
        "StreamStatus"] == "ACTIVE", timeout=60, what=f"{stream} ACTIVE")
    options = {
        "streamName": stream, "applicationName": f"soak-{rng.randrange(10**8)}", "endpointUrl": kinesis_url,
        "dynamodbEndpointUrl": writes.url, "region": "us-east-1", "awsAccessKeyId": "local",
        "awsSecretKey": "local", "tipReportHost": "127.0.0.1", "shardDiscoveryIntervalMs": "1000",
    }
    db = out / "sink.db"
    producer = BackgroundProducer(kinesis, stream, burst=20, interval=0.5).start()
    samples: list[dict[str, Any]] = []
    runs: list[str] = []
    started = time.monotonic()
    end = started + args.minutes * 60
    with Resharder(kinesis, stream, rng, interval=(0.8 * args.reshard_every, 1.2 * args.reshard_every)) as resharder:
        ck, i = 0, 0
        while True:
            run = f"run{i:02d}"
            if i > 0 and i % 2 == 0:
                ck += 1  # odd restarts keep the Spark checkpoint, even ones drop it
            runs.append(run)
            driver = ChaosDriver(run, out, out / f"ck{ck}", options, fmt="kinesis-ddb", db=db)
            wait_for(lambda d=driver: d.check_alive() and d.started(), timeout=240, what=f"{run} to start")
            run_start = time.monotonic()
            stop_at = min(end, run_start + args.kill_every * 60)
            last = stop_at >= end
            seen_batches: set[int] = set()
            while time.monotonic() < stop_at:
                driver.check_alive()
                before = len(seen_batches)
                seen_batches |= batches_of(out, run)
                samples.append({
                    "t_s": round(time.monotonic() - started, 1), "run": run,
                    "run_s": round(time.monotonic() - run_start, 1), "batches": len(seen_batches) - before,
                    "ddb_items": writes.items, "records_put": producer.count(),
                    **{k: v for k, v in sample_tree(driver.proc.pid).items()},
                })
                time.sleep(min(10.0, max(0.0, stop_at - time.monotonic())))
            if last:
                break
            driver.kill()
            i += 1
        sent = producer.stop()
        want = {(p.shard_id, p.seq) for p in sent}
        wait_for(lambda: driver.check_alive() and want <= {(r[1], r[2]) for r in sink_records(db)},
                 timeout=600, interval=1, what="the last run to drain the stream")
        reshards = list(resharder.done)
    driver.kill()
    deliveries = load_deliveries(out / "deliveries", runs)
    totals = check(((p.shard_id, p.seq) for p in sent), deliveries).totals()
    result = {
        "minutes": args.minutes, "backend": args.backend, "seed": args.seed, "runs": len(runs),
        "kills": len(runs) - 1, "reshards": len(reshards), "records": len(sent), **totals,
        "out_of_key_order": key_order_violations(sent, deliveries), "ddb_write_calls": writes.calls,
        "ddb_items": writes.items, "samples": samples,
    }
    (out / "soak.json").write_text(json.dumps(result, indent=1, sort_keys=True))
    return result


def table(result: dict[str, Any], warmup_min: float) -> str:
    """Markdown: resources per minute, then per run the growth after warm-up."""
    lines = ["| minute | run | driver RSS MiB / fds | planner RSS MiB / fds | workers (n) RSS MiB / fds "
             "| JVM RSS MiB / fds | batches | DynamoDB items per batch |", "|---|---|---|---|---|---|---|---|"]
    by_minute: dict[int, list[dict]] = defaultdict(list)
    for s in result["samples"]:
        by_minute[int(s["t_s"] // 60)].append(s)
    prev_items = 0
    for minute, group in sorted(by_minute.items()):
        last = group[-1]
        batches = sum(s["batches"] for s in group)
        items = last["ddb_items"] - prev_items
        prev_items = last["ddb_items"]

        def cell(kind: str, last=last) -> str:
            return f"{last[kind]['rss_mib']:.0f} / {last[kind]['fds']}"

        lines.append(f"| {minute + 1} | {last['run']} | {cell('driver')} | {cell('planner')} | "
                     f"({last['workers']['procs']}) {cell('workers')} | {cell('jvm')} | {batches} | "
                     f"{items / batches if batches else 0:.1f} |")
    lines += ["", "| run | minutes sampled | RSS growth after warm-up, MiB: driver / planner / workers / JVM "
              "| fds growth: driver / planner / workers / JVM |", "|---|---|---|---|"]
    for run in dict.fromkeys(s["run"] for s in result["samples"]):
        mine = [s for s in result["samples"] if s["run"] == run]
        warm = [s for s in mine if s["run_s"] >= warmup_min * 60]
        if len(warm) < 2:
            continue
        first, last = warm[0], warm[-1]
        rss = " / ".join(f"{last[k]['rss_mib'] - first[k]['rss_mib']:+.0f}" for k in KINDS)
        fds = " / ".join(f"{last[k]['fds'] - first[k]['fds']:+d}" for k in KINDS)
        lines.append(f"| {run} | {mine[-1]['run_s'] / 60:.1f} | {rss} | {fds} |")
    keys = ("records", "delivered", "lost", "invented", "duplicated", "out_of_order", "out_of_key_order",
            "kills", "reshards", "ddb_items")
    lines += ["", ", ".join(f"{k} {result[k]}" for k in keys)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--kill-every", type=float, default=10, help="minutes between driver kills")
    parser.add_argument("--reshard-every", type=float, default=60, help="seconds between reshards")
    parser.add_argument("--warmup", type=float, default=3, help="minutes of each run not counted as growth")
    parser.add_argument("--backend", choices=("kinesis-local", "moto"), default="kinesis-local")
    parser.add_argument("--seed", type=int, default=random.SystemRandom().randrange(1, 10**6))
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    result = soak(args)
    print(table(result, args.warmup))
    bad = result["lost"] + result["invented"] + result["out_of_order"] + result["out_of_key_order"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
