"""The raw boto3 baseline: one thread per shard reading its backlog with ``GetRecords`` as fast
as the server answers, in a process of its own (so that neither the benchmark's servers nor
Spark share its GIL, and its CPU is its own).

Under quotas it does what a plain boto3 program does: botocore's standard retry mode retries a
refused call (``ProvisionedThroughputExceededException``) after its exponential, jittered
backoff; ``max_attempts`` is raised so that no read gives up (the default, 3, fails a shard's
read at its third refusal in a row). Nothing else paces it.

    python -m benchmarks.raw_loop URL STREAM SHARD=RECORDS [SHARD=RECORDS ...]

prints one JSON line: ``seconds`` (first call to last answer), ``cpu_seconds`` (the process's
CPU over the same span, both threads' parsing), ``process_cpu_seconds`` (the whole program's:
its start, importing boto3 and making its client too, as a Spark query's start is counted),
``records`` and ``data_bytes`` read.

:func:`decode_floor` is the least CPU any reader spends on the same records: the pages' JSON
parsed with ``json`` and each record's data decoded with ``base64``, nothing else, on one core.
"""

from __future__ import annotations

import base64
import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

PAGE_LIMIT = 10000
MAX_ATTEMPTS = 50
ACCESS_KEY = "raw"  # how a quota proxy tells its calls apart
GIB = float(1 << 30)  # what CPU per GiB divides by (every suite's)


def read_all(url: str, stream: str, per_shard: dict[str, int], region: str = "us-east-1") -> dict[str, Any]:
    """Read every shard's ``per_shard`` records from ``TRIM_HORIZON``; the figures above."""
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "kinesis", endpoint_url=url, region_name=region, aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key="raw-secret",
        config=Config(retries={"mode": "standard", "max_attempts": MAX_ATTEMPTS},
                      max_pool_connections=max(10, len(per_shard))),
    )
    counts: dict[str, tuple[int, int]] = {}

    def read(shard: str) -> None:
        it = client.get_shard_iterator(
            StreamName=stream, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        got = size = 0
        while got < per_shard[shard]:
            page = client.get_records(ShardIterator=it, Limit=PAGE_LIMIT)
            got += len(page["Records"])
            size += sum(len(r["Data"]) for r in page["Records"])
            it = page["NextShardIterator"]
        counts[shard] = (got, size)

    threads = [threading.Thread(target=read, args=(s,)) for s in per_shard]
    cpu0, start = time.process_time(), time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu0
    got = {s: c[0] for s, c in counts.items()}
    if got != per_shard:
        raise RuntimeError(f"raw loop read {got}, expected {per_shard}")
    return {"seconds": elapsed, "cpu_seconds": cpu, "process_cpu_seconds": time.process_time(),
            "records": sum(got.values()),
            "data_bytes": sum(c[1] for c in counts.values())}


def run(url: str, stream: str, per_shard: dict[str, int]) -> dict[str, Any]:
    """:func:`read_all` in a new process (this interpreter); its JSON answer."""
    args = [sys.executable, "-m", "benchmarks.raw_loop", url, stream,
            *(f"{shard}={n}" for shard, n in per_shard.items())]
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(args, capture_output=True, text=True, timeout=900, cwd=root)
    if done.returncode != 0:
        raise RuntimeError(f"raw loop failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _call(url: str, op: str, body: dict[str, Any]) -> bytes:
    """One Kinesis call's raw answer (no SDK: the floor parses the bytes itself)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "Content-Type": "application/x-amz-json-1.1", "X-Amz-Target": f"Kinesis_20131202.{op}",
        "Authorization": "AWS4-HMAC-SHA256 Credential=floor/20260101/us-east-1/kinesis/aws4_request, "
                         "SignedHeaders=host, Signature=0",
    })
    with urllib.request.urlopen(req, timeout=120) as resp:
        return resp.read()


def raw_pages(url: str, stream: str, per_shard: dict[str, int]) -> list[bytes]:
    """Every shard's backlog as the server answers it: ``GetRecords`` bodies, unparsed (read
    straight from the server ``url``, not through a quota proxy)."""
    pages = []
    for shard, want in per_shard.items():
        it = json.loads(_call(url, "GetShardIterator", {
            "StreamName": stream, "ShardId": shard, "ShardIteratorType": "TRIM_HORIZON"}))["ShardIterator"]
        got = 0
        while got < want:
            body = _call(url, "GetRecords", {"ShardIterator": it, "Limit": PAGE_LIMIT})
            page = json.loads(body)
            got += len(page["Records"])
            it = page["NextShardIterator"]
            pages.append(body)
    return pages


def decode_floor(pages: list[bytes], repeats: int = 3) -> dict[str, Any]:
    """CPU seconds (median of ``repeats``, one thread) to ``json``-parse ``pages`` and
    ``base64``-decode every record's data, the data bytes decoded, and the two as CPU seconds
    per GiB."""
    times, size = [], 0
    for _ in range(repeats):
        size = 0
        cpu0 = time.process_time()
        for body in pages:
            for rec in json.loads(body)["Records"]:
                size += len(base64.b64decode(rec["Data"]))
        times.append(time.process_time() - cpu0)
    cpu = statistics.median(times)
    return {"cpu_seconds": cpu, "data_bytes": size, "cpu_s_per_gib": cpu / (size / GIB)}


def main() -> None:
    """Command-line entry point (see the module docstring)."""
    url, stream, *pairs = sys.argv[1:]
    per_shard = {p.split("=")[0]: int(p.split("=")[1]) for p in pairs}
    print(json.dumps(read_all(url, stream, per_shard)), flush=True)


if __name__ == "__main__":
    main()
