"""Memory: the executor read path's RSS while it reads one 1M-record range.

A child process runs what ``read()`` runs (``RangeReader`` + ``records.user_records`` +
``records.to_record_batch``, over the source's own shared boto3 client) through real HTTP against
a canned Kinesis server in this process, dropping each Arrow batch as Spark would after sending
it, and samples its own RSS (``/proc/self/statm``) after every page. Growth is the peak less the
RSS after the first page (clients made, first buffers allocated): it must stay flat, as records
stream page by page and a range is never buffered whole.

Why a canned server: moto's PutRecord looks up the shard's last sequence number by listing all of
its keys, so 1M records in one shard would take hours to put.

    python -m benchmarks.memory [--quick]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from benchmarks.common import describe, summary

BASE_SEQ = 49590338271490256608559692538361571095921575989136588898
RECORD_BYTES = 100
STREAM, SHARD = "memory", "shardId-000000000000"


class CannedKinesis:
    """A one-shard Kinesis on 127.0.0.1 holding ``records`` records of ``RECORD_BYTES`` bytes;
    iterators are record indexes. ``with CannedKinesis(n) as k: k.url``."""

    def __init__(self, records: int) -> None:
        self.records = records
        data = base64.b64encode(os.urandom(RECORD_BYTES)).decode()
        # One record's JSON with a hole for its sequence number: pages are built by joining.
        self._template = (
            '{"Data":"' + data + '","PartitionKey":"pk","SequenceNumber":"%d",'
            '"ApproximateArrivalTimestamp":1790000000.125}'
        )
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "CannedKinesis":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()

    def answer(self, op: str, req: dict[str, Any]) -> bytes:
        """The JSON body for one request."""
        if op == "GetShardIterator":
            return json.dumps({"ShardIterator": "0"}).encode()
        if op == "GetRecords":
            first = int(req["ShardIterator"])
            last = min(self.records, first + int(req.get("Limit", 10000)))
            records = ",".join(self._template % (BASE_SEQ + i) for i in range(first, last))
            behind = 0 if last == self.records else 1000
            return (
                '{"Records":[' + records + f'],"NextShardIterator":"{last}",'
                f'"MillisBehindLatest":{behind}}}'
            ).encode()
        raise ValueError(op)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                op = (self.headers.get("X-Amz-Target") or "").rpartition(".")[2]
                data = server.answer(op, json.loads(body or b"{}"))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-amz-json-1.1")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(url: str, records: int) -> dict[str, Any]:
    """Read the whole range as an executor does; RSS samples and rows read."""
    import time

    from benchmarks.common import settings
    from kinesis_source.aws import shared_client
    from kinesis_source.kinesis import RangeReader
    from kinesis_source.positions import Position, ShardRange
    from kinesis_source.records import to_record_batch, user_records

    rng = ShardRange(STREAM, SHARD, Position.trim_horizon(), str(BASE_SEQ + records - 1))
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
    with CannedKinesis(records) as server:
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
