"""Catch-up: reading a backlog at the shard's physical read limit, never throttled (issue 20), on
moto behind the quota-enforcing proxy of ``tests/support/quota.py`` (5 ``GetRecords`` a second
and a 2 MiB/s byte bucket 10 MiB deep per shard, every caller together).

Records are ``RECORD_BYTES`` bytes of data (the neighbour case: ``NEIGHBOUR_RECORD_BYTES``) with
a partition key of one to two characters; bytes are counted as Kinesis and the proxy count them
(data and partition key). The proxy here (:class:`MeteredProxy`) also keeps the bytes of every
``GetRecords`` answer and when it passed, so that each call is known with its time (arrival at
the proxy), shard, caller, bytes and answer time; each refusal with its reason (the shard's byte
bucket empty, or its 5 calls of the last second made); and the server's 5xx answers.

1. **Catch-up** (``Trigger.AvailableNow``, ``initialPosition=TRIM_HORIZON``, ``noop`` sink,
   default options but endpoints and credentials): every shard holds a backlog of
   ``CATCHUP_RECORDS`` records (>= 25 MiB; ``--quick``: ``QUICK_CATCHUP_RECORDS``, ~15 MiB),
   written with ``PutRecords`` batches of 500 straight to moto before the query starts. Per
   shard, the *read window* runs from the executors' (client ``sync``) first ``GetRecords`` that
   returned records to their last: the read of the backlog, not Spark's start of the query (the
   driver's first probes read a few records seconds before any executor runs). A reader can do
   no better than take the full 10 MiB bucket at once and then 2 MiB/s, so the *physical limit*
   is ``(backlog bytes - 10 MiB) / 2 MiB/s``; the target figure is physical / read window (the
   worst shard's). The first executor answer's time at the proxy (answer - call) is reported
   too: the proxy charges a response when it passes, so while that first answer (a lead page of
   about 2.25 MiB, read_rate.py's ``LEAD_BUILD_S``) is on its way the bucket sits full and its
   refill is lost; *limit with the first answer* = physical + that time, and the ratio against
   it is a second figure. The whole query's window (from the
   driver's first data call) is kept for information. Also the source's refusals (by reason) and
   the rows read against the records written, and how busy the machine was during the worst
   shard's read (over it, in its busiest second, and its busiest process: a run marked
   CPU-bound measures the machine). 1 shard (``--quick``: only this), 4 and 16 shards. Each size runs on
   moto and again on the canned server (:mod:`benchmarks.canned`; the same backlog, there when
   the server starts), behind the same proxy: moto builds a 10 MB answer in most of a second on
   the cores the reader uses, a remote Kinesis does not.
2. **Neighbour**: one shard, and another application (access key ``neighbour``, boto3 without
   retries) reading it from ``TRIM_HORIZON`` once a second with a ``Limit`` of ~1 MiB of records,
   counting its refusals; ``NEIGHBOUR_LEAD_S`` later the source's query starts (Spark's default
   trigger, ``TRIM_HORIZON``) and both run for ``NEIGHBOUR_RUN_S`` (5 minutes: long enough to show
   the source's refusals after the first contact, which the model holds what it learnt from for a
   minute and then lets fade; with the cap 90 s; ``--quick``: 30 s). Nothing is written during the
   run (moto answers 500 to a ``GetRecords`` that races a ``PutRecords``, and botocore's retries of
   those add calls to the shard's 5-a-second window), so the shard holds a backlog that neither
   reader reaches the end of: each reads it from the start at about 1 MiB/s, so 1.1 MiB per second
   of the run and 20 MiB more. Its records are ``NEIGHBOUR_RECORD_BYTES`` long: moto's
   ``PutRecord`` copies the shard's keys for every record, so writing 200 MiB of 1 KB records takes
   minutes, of 10 KB records seconds (the quotas count bytes; record size only changes records per
   call). Figures: the source's bytes/s from ``SKIP_S`` after its first data call to the end (the
   neighbour's 1 MiB/s leaves it ~1 MiB/s), both readers' refusals by reason, the source's refusals
   per minute and the server's 5xx answers. Run twice: default options, and
   ``maxReadRatePerShard=1MiB``.
3. **Cap**: ``maxReadRatePerShard=0.5MiB``, one shard with a ``CAP_BACKLOG_MIB`` backlog, a
   timed run of ``CAP_RUN_S`` (default trigger): the rate is the bytes of the source's data
   calls after its first / (last data call - first data call); the steady rate the same from
   ``CAP_BURST_S`` after the executors' first data call (the cap's bucket starts full: any span of ``T``
   seconds may read ``T + CAP_BURST_S`` seconds of the cap), and the most any span read beyond
   the cap's rate over it.

    python -m benchmarks.catchup [--quick]
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from benchmarks import raw_loop, spark_env
from benchmarks.canned import CannedKinesisServer, StreamSpec
from benchmarks.client_cpu import ClientCpu
from benchmarks.common import (
    PUT_BATCH,
    REGION,
    CpuSampler,
    create_stream,
    settings,
    shard_hash_keys,
    source_options,
)
from benchmarks.quota import _rows_read
from benchmarks.report import _reasons, _worst_shard
from kinesis_source.read_rate import CAP_BURST_S
from tests.support.proxy import THROTTLED, Seen
from tests.support.quota import WINDOW_S, QuotaProxy

MIB = 1024 * 1024
SHARD_BYTES_PER_S = 2 * MIB
BURST_BYTES = 10 * MIB
RECORD_BYTES = 1000
SOURCE_KEY = "local"  # the source's access key (source_options)
NEIGHBOUR_KEY = "neighbour"
CHECKPOINT_TABLE = "kinesis-ddb-bench-catchup"

CATCHUP_RECORDS = 27_000  # per shard: 25.8 MiB
QUICK_CATCHUP_RECORDS = 16_000  # 15.3 MiB
SHARD_COUNTS = (1, 4, 16)
BACKENDS = ("moto", "canned")
QUICK_SHARD_COUNTS = (1,)
CATCHUP_TIMEOUT_S = 600.0

NEIGHBOUR_RUN_S, CAPPED_NEIGHBOUR_RUN_S, QUICK_NEIGHBOUR_RUN_S = 300.0, 90.0, 30.0
NEIGHBOUR_RECORD_BYTES = 10_000
NEIGHBOUR_BYTES_PER_S = 1 * MIB
NEIGHBOUR_LEAD_S = 3.0  # the neighbour reads alone this long before the query starts
SKIP_S = 10.0  # the source's rate beside the neighbour: from this long after its first data call

CAP = "0.5MiB"
CAP_BYTES_PER_S = 0.5 * MIB
CAP_BACKLOG_MIB, QUICK_CAP_BACKLOG_MIB = 20, 12
CAP_RUN_S, QUICK_CAP_RUN_S = 40.0, 20.0

BYTES, CALLS = "bytes", "calls"  # why a call was refused: the byte bucket empty, the call window full


@dataclass(frozen=True)
class Answer:
    """One ``GetRecords`` answered by the server: the call, and what it carried."""

    call: Seen
    bytes: int
    records: int
    done: float  # time.monotonic() when the answer was read from the server

    @property
    def latency(self) -> float:
        """Seconds from the call's arrival at the proxy to its answer passing it."""
        return self.done - self.call.at


class MeteredProxy(QuotaProxy):
    """The quota proxy, also keeping each ``GetRecords`` answer's bytes (:class:`Answer`), the
    server's 5xx answers, and why each call was refused (``reasons``: :data:`BYTES` or
    :data:`CALLS`, by the refused call as recorded)."""

    def __init__(self, target_url: str) -> None:
        super().__init__(target_url)
        self.answers: list[Answer] = []
        self.failures: list[tuple[Seen, int, str]] = []  # the server's 5xx answers
        self.reasons: dict[Seen, str] = {}

    def _refusal(self, call: Seen, req: dict[str, Any]) -> str | None:
        code = super()._refusal(call, req)
        if code is not None:
            with self._lock:
                self.reasons[dataclasses.replace(call, injected=code)] = self._why(call)
        return code

    def _why(self, call: Seen) -> str:
        """Which budget refused ``call``, checked as ``QuotaProxy._refusal`` checks them (the
        bucket first, then the call window), without changing either."""
        if call.operation != "GetRecords" or call.shard is None:
            return CALLS  # the other quotas count calls only
        bucket = self._buckets.get(call.shard)
        if bucket is not None and min(bucket.depth, bucket.tokens + max(0.0, call.at - bucket.at) * bucket.rate) <= 0:
            return BYTES
        window = self._windows.get(("GetRecords", call.shard), ())
        if sum(1 for t in window if t > call.at - WINDOW_S) >= self.quotas.get_records_calls:
            return CALLS
        return "unknown"  # a budget changed between the refusal and this look (another thread)

    def _transform(self, call: Seen, body: bytes, status: int, data: bytes) -> bytes:
        data = super()._transform(call, body, status, data)
        if status >= 500:
            with self._lock:
                self.failures.append((call, status, data[:200].decode(errors="replace")))
        return data

    def _charged(self, call: Seen, spent: int, records: int) -> None:
        self.answers.append(Answer(call, spent, records, time.monotonic()))

    def data_calls(self, key: str, shard: str | None = None) -> list[Answer]:
        """``key``'s answers with records (of ``shard``), by arrival."""
        with self._lock:
            out = [a for a in self.answers if a.call.access_key == key and a.records
                   and (shard is None or a.call.shard[1] == shard)]  # type: ignore[index]
        return sorted(out, key=lambda a: a.call.at)

    def refusals(self, key: str, shard: str | None = None, until: float = float("inf")) -> list[Seen]:
        """``key``'s calls a quota refused (about ``shard``), up to ``until``."""
        return self.calls(where=lambda s: s.access_key == key and s.at <= until
                          and (shard is None or (s.shard is not None and s.shard[1] == shard)), refused=True)

    def refusal_counts(self, key: str, shard: str | None = None, until: float = float("inf")) -> dict[str, Any]:
        """``key``'s refusals (about ``shard``) up to ``until``: in all, by reason, by operation."""
        refused = self.refusals(key, shard, until)
        by_reason: dict[str, int] = {}
        by_op: dict[str, int] = {}
        for s in refused:
            why = self.reasons.get(s, "unknown")
            by_reason[why] = by_reason.get(why, 0) + 1
            by_op[s.operation] = by_op.get(s.operation, 0) + 1
        return {"total": len(refused), "by_reason": by_reason, "by_operation": by_op}

    def failure_list(self, t0: float) -> list[list[Any]]:
        """The server's 5xx answers: ``[seconds after t0, operation, caller, status, body's start]``."""
        with self._lock:
            return [[round(c.at - t0, 2), c.operation, c.access_key, status, text]
                    for c, status, text in self.failures]


def _who(s: Seen) -> str:
    if s.access_key != SOURCE_KEY:
        return str(s.access_key)
    return "driver" if s.client == "async" else "executor"


def _timeline(proxy: MeteredProxy, shard: str, t0: float, keys: tuple[str, ...] = (SOURCE_KEY,)) -> list[list[Any]]:
    """Every ``GetRecords`` of ``keys`` on ``shard`` as ``[seconds after t0, who, bytes, records,
    seconds after t0 its answer passed the proxy]`` (``who``: driver, executor or neighbour;
    bytes ``"refused: bytes"`` or ``"refused: calls"`` for a refusal and why, the status
    (``"500"``) for a server failure)."""
    with proxy._lock:
        answered = {id(a.call): a for a in proxy.answers}
        failed = {id(c): status for c, status, _ in proxy.failures}
    out = []
    for s in proxy.calls("GetRecords", where=lambda s: s.access_key in keys and s.shard is not None
                         and s.shard[1] == shard):
        a = answered.get(id(s))
        if s.injected == THROTTLED:
            out.append([round(s.at - t0, 3), _who(s), f"refused: {proxy.reasons.get(s, 'unknown')}", 0, None])
        elif a is not None:
            out.append([round(s.at - t0, 3), _who(s), a.bytes, a.records, round(a.done - t0, 3)])
        elif id(s) in failed:
            out.append([round(s.at - t0, 3), _who(s), str(failed[id(s)]), 0, None])
    return out


def _key(i: int) -> str:
    return str(i % 100)  # a short partition key: one or two characters


def _fill(client: Any, stream: str, keys: list[tuple[str, str]], per_shard: int,
          record_bytes: int = RECORD_BYTES) -> dict[str, int]:
    """``per_shard`` records of ``record_bytes`` in every shard (``PutRecords`` of 500, each to
    one shard); returns each shard's bytes as Kinesis counts them (data and partition keys)."""
    payload = os.urandom(record_bytes)
    out = {}
    for shard, hash_key in keys:
        total = 0
        for start in range(0, per_shard, PUT_BATCH):
            batch = [{"Data": payload, "PartitionKey": _key(i), "ExplicitHashKey": hash_key}
                     for i in range(start, min(per_shard, start + PUT_BATCH))]
            resp = client.put_records(StreamName=stream, Records=batch)
            assert resp.get("FailedRecordCount", 0) == 0, resp
            assert {r["ShardId"] for r in resp["Records"]} == {shard}
            total += sum(len(r["Data"]) + len(r["PartitionKey"]) for r in batch)
        out[shard] = total
    return out


@contextmanager
def _query(spark: Any, options: dict[str, str], available_now: bool) -> Iterator[Any]:
    """A query of the source into ``noop`` (``Trigger.AvailableNow`` or the default trigger) on
    a fresh checkpoint, stopped and its checkpoint removed on leaving."""
    checkpoint = tempfile.mkdtemp(prefix="kddb-catchup-")
    reader = spark.readStream.format("kinesis-ddb")
    for key, value in options.items():
        reader = reader.option(key, value)
    writer = reader.load().writeStream.format("noop").option("checkpointLocation", checkpoint)
    if available_now:
        writer = writer.trigger(availableNow=True)
    query = writer.start()
    try:
        yield query
    finally:
        query.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)


def _stream(url: str, shards: int, prefix: str) -> tuple[Any, str, list[tuple[str, str]]]:
    client = settings(url).boto3_client("kinesis")
    stream = create_stream(client, shards, prefix)
    return client, stream, shard_hash_keys(client, stream)


def _options(proxy: MeteredProxy, url: str, stream: str, **extra: str) -> dict[str, str]:
    options = source_options(proxy.url, stream, checkpointTable=CHECKPOINT_TABLE,
                             initialPosition="TRIM_HORIZON", **extra)
    options["dynamodbEndpointUrl"] = url  # DynamoDB straight to moto: only Kinesis has quotas
    return options


# -- 1. catch-up ---------------------------------------------------------------------------


def _shard_figures(proxy: MeteredProxy, shard: str, backlog: int, started: float,
                   cpu: CpuSampler | None = None) -> dict[str, Any]:
    """One shard of a catch-up: the executors' read window against the physical limit (also
    with the first executor answer's time), the whole query's window, calls and refusals."""
    calls = proxy.data_calls(SOURCE_KEY, shard)
    execs = [a for a in calls if a.call.client == "sync"]
    window = execs[-1].call.at - execs[0].call.at if len(execs) > 1 else 0.0
    query_window = calls[-1].call.at - calls[0].call.at if len(calls) > 1 else 0.0
    physical = max(0.0, backlog - BURST_BYTES) / SHARD_BYTES_PER_S
    first_answer = execs[0].latency if execs else 0.0
    refused = proxy.refusal_counts(SOURCE_KEY, shard)
    busy = peak = busiest = None
    if cpu is not None and execs:
        read = (execs[0].call.at, execs[-1].call.at)
        busy, peak, busiest = cpu.busy(*read), cpu.peak_busy(*read), cpu.busiest(*read)
    return {
        "shard": shard,
        "backlog_bytes": backlog,
        "bytes_read": sum(a.bytes for a in calls),
        "data_calls": len(calls),
        "driver_data_calls": len(calls) - len(execs),
        "driver_bytes": sum(a.bytes for a in calls if a.call.client != "sync"),
        "physical_s": round(physical, 3),
        # the target: the executors' read, first to last data call
        "read_window_s": round(window, 3),
        "read_ratio": physical / window if window else 0.0,
        "first_executor_call_s": round(execs[0].call.at - started, 3) if execs else None,
        "first_executor_bytes": execs[0].bytes if execs else 0,
        "first_executor_answer_s": round(first_answer, 3),
        "limit_with_first_answer_s": round(physical + first_answer, 3),
        "ratio_with_first_answer": (physical + first_answer) / window if window else 0.0,
        # (what the executors' bytes after their first call take at 2 MiB/s)
        "executor_ideal_s": round(sum(a.bytes for a in execs[1:]) / SHARD_BYTES_PER_S, 3),
        # for information: the whole query's window, from the driver's first data call
        "first_data_call_s": round(calls[0].call.at - started, 3) if calls else None,
        "query_window_s": round(query_window, 3),
        "query_ratio": physical / query_window if query_window else 0.0,
        "refused": refused["total"],
        "refused_by_reason": refused["by_reason"],
        # how busy the whole machine (every core) was during the read window, over it and in its
        # busiest second (near 1.0, the figure measures the machine, not the pacing), and the
        # process that used the most CPU then, in cores (one is all a Python process's GIL gives)
        "machine_busy": busy,
        "machine_busy_peak": peak,
        "busiest_process": busiest,
        "get_records_calls": len(proxy.calls("GetRecords", where=lambda s: s.access_key == SOURCE_KEY
                                             and s.shard is not None and s.shard[1] == shard)),
    }


def cpu_bound(cpu: CpuSampler, proxy: MeteredProxy, rows: int) -> dict[str, Any]:
    """How close the executors' read ran to what the machine's CPU allows (issue 51 item 3):
    over the window from the executors' first data call to their last (every shard), the cores
    the client used (Spark's JVM and its Python processes) and the cores left to it (the
    machine's less what the servers used: moto or the canned server, the quota proxy's threads
    in the benchmark's process). The client's records/s per core times the cores left is what
    the CPU allows; the ratio is client cores / cores left."""
    execs = [a.call.at for a in proxy.data_calls(SOURCE_KEY) if a.call.client == "sync"]
    if len(execs) < 2:
        return {}
    start, end = min(execs), max(execs)
    kinds = cpu.cores_by_kind(start, end)
    client = kinds.get("java", 0.0) + kinds.get("spark-python", 0.0)
    servers = sum(v for k, v in kinds.items() if k not in ("java", "spark-python"))
    cores = os.cpu_count() or 1
    left = max(0.01, cores - servers)
    rps = rows / (end - start)
    return {"window_s": end - start, "records_per_s": rps, "client_cores": client, "server_cores": servers,
            "cores": cores, "cores_left": left, "allowed_records_per_s": rps / client * left if client else None,
            "ratio": client / left, "by_kind": kinds}


def catch_up(spark: Any, url: str, shards: int, per_shard: int, backend: str = "moto") -> dict[str, Any]:
    """One ``Trigger.AvailableNow`` run over a backlog of ``per_shard`` records per shard, on
    moto (written with ``PutRecords`` first) or on the canned server (``backend="canned"``: the
    backlog is there when it starts, each page a join of pre-built records)."""
    with contextlib.ExitStack() as stack:
        began = time.monotonic()
        if backend == "canned":
            spec = StreamSpec(f"catchup-{shards}-{uuid.uuid4().hex[:8]}", shards, per_shard, RECORD_BYTES)
            server = stack.enter_context(CannedKinesisServer([spec]))
            kinesis_url, stream, shard_ids = server.url, spec.name, spec.shard_ids()
            backlog = dict.fromkeys(shard_ids, spec.shard_bytes())
        else:
            client, stream, keys = _stream(url, shards, "catchup")
            kinesis_url, shard_ids = url, [shard for shard, _ in keys]
            backlog = _fill(client, stream, keys, per_shard)
        fill_s = time.monotonic() - began
        proxy = stack.enter_context(MeteredProxy(kinesis_url))
        cpu = stack.enter_context(CpuSampler())
        started = time.monotonic()
        with ClientCpu().window() as used, _query(spark, _options(proxy, url, stream), available_now=True) as query:
            if not query.awaitTermination(CATCHUP_TIMEOUT_S):
                raise TimeoutError(f"AvailableNow over {shards} shard(s): not done in {CATCHUP_TIMEOUT_S:.0f} s")
            if query.exception() is not None:
                raise RuntimeError(f"the query failed: {query.exception()}")
            ended = time.monotonic()
            rows = _rows_read(query)
            progress = [json.loads(p.json) for p in query.recentProgress]
        per = [_shard_figures(proxy, shard, backlog[shard], started, cpu) for shard in shard_ids]
        worst = min(per, key=lambda p: p["read_ratio"])
        refused = proxy.refusal_counts(SOURCE_KEY)
        bound = cpu_bound(cpu, proxy, rows)
        data_gib = per_shard * shards * RECORD_BYTES / raw_loop.GIB
        with MeteredProxy(kinesis_url) as raw_proxy:
            raw = raw_loop.run(raw_proxy.url, stream, dict.fromkeys(shard_ids, per_shard))
            raw_refused = raw_proxy.refused()
        floor = raw_loop.decode_floor(raw_loop.raw_pages(kinesis_url, stream, dict.fromkeys(shard_ids, per_shard)), 1)
        with ClientCpu().window() as api:  # what the Python data source API costs one query
            spark_env.one_batch(spark, "python-floor", {"numPartitions": str(spark_env.tasks_for(spark, shards))})
        return {
            "cpu_bound": bound,
            "client_cpu_s": used[0].total,
            "cpu_s_per_gib": used[0].total / data_gib,
            "api_query_cpu_s": api[0].total,
            "net_cpu_s_per_gib": (used[0].total - api[0].total) / data_gib,
            # the raw loop's whole process (its start and client included), and its reading alone
            "raw_loop": {**raw, "refused": raw_refused, "cpu_s_per_gib": raw["process_cpu_seconds"] / data_gib,
                         "loop_cpu_s_per_gib": raw["cpu_seconds"] / data_gib},
            "floor_cpu_s_per_gib": floor["cpu_s_per_gib"],
            "backend": backend,
            "shards": shards,
            "records_per_shard": per_shard,
            "records_written": per_shard * shards,
            "records_read": rows,
            "batches": sum(1 for p in progress if p["numInputRows"] > 0),
            "batch_duration_ms": [p["durationMs"] for p in progress if p["numInputRows"] > 0],
            "fill_seconds": round(fill_s, 1),
            "query_seconds": round(ended - started, 1),
            "worst_shard": worst["shard"],
            "read_ratio_worst": worst["read_ratio"],
            "read_ratio_median": sorted(p["read_ratio"] for p in per)[len(per) // 2],
            "ratio_with_first_answer_worst": min(p["ratio_with_first_answer"] for p in per),
            "query_ratio_worst": min(p["query_ratio"] for p in per),
            "refused_source": refused["total"],
            "refused_by_reason": refused["by_reason"],
            "refused_by_op": refused["by_operation"],
            "server_failures": proxy.failure_list(started),
            "per_shard": per,
            # the worst shard's calls (seconds after the query's start), for reading what happened
            "timeline_worst_shard": _timeline(proxy, worst["shard"], started),
        }


# -- 2. neighbour --------------------------------------------------------------------------


class ShardNeighbour:
    """Another application reading one shard from ``TRIM_HORIZON`` once a second, each call
    asking for ~``bytes_per_s`` of records, without retries: ``refused`` counts refusals."""

    def __init__(self, url: str, stream: str, shard: str, bytes_per_s: float, record_bytes: int) -> None:
        self._client = boto3.client(
            "kinesis", endpoint_url=url, region_name=REGION, aws_access_key_id=NEIGHBOUR_KEY,
            aws_secret_access_key="local", config=Config(retries={"total_max_attempts": 1}),
        )
        self._stream, self._shard = stream, shard
        self.limit = max(1, round(bytes_per_s / record_bytes))
        self.calls = self.refused = self.bytes = self.records = 0
        self.errors: list[str] = []
        self.error_times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        it = self._client.get_shard_iterator(StreamName=self._stream, ShardId=self._shard,
                                             ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        began, n = time.monotonic(), 0
        while not self._stop.wait(max(0.0, began + n - time.monotonic())):  # once a second
            n += 1
            self.calls += 1
            try:
                resp = self._client.get_records(ShardIterator=it, Limit=self.limit)
            except ClientError as exc:
                code = exc.response["Error"]["Code"]
                if code == THROTTLED:
                    self.refused += 1
                else:
                    self.errors.append(code)
                    self.error_times.append(time.monotonic())
                continue
            it = resp["NextShardIterator"]
            self.records += len(resp["Records"])
            self.bytes += sum(len(r["Data"]) + len(r["PartitionKey"]) for r in resp["Records"])

    def __enter__(self) -> ShardNeighbour:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def _backlog_records(mib: float, record_bytes: int) -> int:
    return int(mib * MIB / (record_bytes + 2))


def _one_shard(url: str, prefix: str, backlog_mib: float, record_bytes: int) -> tuple[str, str, int, float]:
    """A new one-shard stream holding a backlog of ``backlog_mib`` in records of ``record_bytes``:
    the stream, its shard, the backlog's bytes and the seconds writing it took."""
    client, stream, keys = _stream(url, 1, prefix)
    began = time.monotonic()
    backlog = _fill(client, stream, keys, _backlog_records(backlog_mib, record_bytes), record_bytes)
    return stream, keys[0][0], backlog[keys[0][0]], time.monotonic() - began


def _timed_run(spark: Any, proxy: MeteredProxy, url: str, stream: str, run_s: float,
               extra: dict[str, str]) -> tuple[float, float, int]:
    """The source's query (default trigger, ``extra`` options) run for ``run_s``: its start, end
    and rows read."""
    started = time.monotonic()
    with _query(spark, _options(proxy, url, stream, **extra), available_now=False) as query:
        while time.monotonic() < started + run_s:
            if not query.isActive:
                raise RuntimeError(f"the query stopped: {query.exception()}")
            time.sleep(0.5)
        return started, time.monotonic(), _rows_read(query)


def _run_figures(proxy: MeteredProxy, started: float, ended: float, backlog: int, rows: int) -> dict[str, Any]:
    return {"run_seconds": round(ended - started, 1), "backlog_bytes": backlog, "rows_read": rows,
            "server_failures": proxy.failure_list(started)}


def beside_neighbour(spark: Any, url: str, run_s: float, backlog_mib: float,
                     extra: dict[str, str], setting: str) -> dict[str, Any]:
    """The source's query catching up beside :class:`ShardNeighbour` for ``run_s``, nothing
    written meanwhile."""
    stream, shard, backlog, fill_s = _one_shard(url, "catchup-nb", backlog_mib, NEIGHBOUR_RECORD_BYTES)
    with MeteredProxy(url) as proxy, \
            ShardNeighbour(proxy.url, stream, shard, NEIGHBOUR_BYTES_PER_S, NEIGHBOUR_RECORD_BYTES + 2) as neighbour:
        time.sleep(NEIGHBOUR_LEAD_S)
        started, ended, rows = _timed_run(spark, proxy, url, stream, run_s, extra)
        neighbour.__exit__(None, None, None)
        ours = [a for a in proxy.data_calls(SOURCE_KEY) if a.call.at <= ended]
        theirs = [a for a in proxy.data_calls(NEIGHBOUR_KEY) if started <= a.call.at <= ended]
        first = ours[0].call.at if ours else ended
        since = first + SKIP_S
        measured = [a for a in ours if a.call.at >= since]
        ours_refused = proxy.refusal_counts(SOURCE_KEY, until=ended)
        their_refused = proxy.refusal_counts(NEIGHBOUR_KEY)
        return {
            **_run_figures(proxy, started, ended, backlog, rows),
            "setting": setting,
            "options": extra,
            "record_bytes": NEIGHBOUR_RECORD_BYTES,
            "fill_seconds": round(fill_s, 1),
            "first_data_call_s": round(first - started, 2),
            "measured_seconds": round(ended - since, 1),
            "source_bytes_per_s": sum(a.bytes for a in measured) / (ended - since) if ended > since else 0.0,
            "source_bytes_per_s_from_first": sum(a.bytes for a in ours) / (ended - first) if ended > first else 0.0,
            "source_bytes": sum(a.bytes for a in ours),
            "source_data_calls": len(ours),
            "neighbour_limit": neighbour.limit,
            "neighbour_calls": neighbour.calls,
            "neighbour_refused": neighbour.refused,
            "neighbour_refused_proxy": their_refused["total"],
            "neighbour_refused_by_reason": their_refused["by_reason"],
            "neighbour_errors": neighbour.errors,
            "neighbour_errors_at_s": [round(t - started, 2) for t in neighbour.error_times],
            "server_failures_get_records": sum(1 for c, _, _ in proxy.failures if c.operation == "GetRecords"),
            "neighbour_bytes_per_s": sum(a.bytes for a in theirs) / (ended - started),
            "source_refused": ours_refused["total"],
            "source_refused_by_reason": ours_refused["by_reason"],
            "source_refused_by_op": ours_refused["by_operation"],
            "source_refused_per_minute": ours_refused["total"] / ((ended - started) / 60),
            "source_refused_at_s": [round(s.at - started, 2) for s in proxy.refusals(SOURCE_KEY, until=ended)],
            "neighbour_refused_at_s": [round(s.at - started, 2) for s in proxy.refusals(NEIGHBOUR_KEY)],
            "timeline": _timeline(proxy, shard, started, (SOURCE_KEY, NEIGHBOUR_KEY)),
        }


# -- 3. cap --------------------------------------------------------------------------------


def capped(spark: Any, url: str, run_s: float, backlog_mib: float) -> dict[str, Any]:
    """``maxReadRatePerShard=0.5MiB`` over one backlogged shard for ``run_s``."""
    stream, shard, backlog, _ = _one_shard(url, "catchup-cap", backlog_mib, RECORD_BYTES)
    with MeteredProxy(url) as proxy:
        started, ended, rows = _timed_run(spark, proxy, url, stream, run_s, {"maxReadRatePerShard": CAP})
        ours = [a for a in proxy.data_calls(SOURCE_KEY) if a.call.at <= ended]
        span = ours[-1].call.at - ours[0].call.at if len(ours) > 1 else 0.0
        after_first = sum(a.bytes for a in ours[1:])
        execs = [a for a in ours if a.call.client == "sync"]
        exec_span = execs[-1].call.at - execs[0].call.at if len(execs) > 1 else 0.0
        refused = proxy.refusal_counts(SOURCE_KEY)
        # After the cap's burst (its bucket starts full, and the executors' first page takes
        # it): the rate it holds a read to.
        steady = [a for a in ours if a.call.at >= execs[0].call.at + CAP_BURST_S] if execs else []
        steady_span = steady[-1].call.at - steady[0].call.at if len(steady) > 1 else 0.0
        return {
            **_run_figures(proxy, started, ended, backlog, rows),
            "steady_bytes_per_s": sum(a.bytes for a in steady[1:]) / steady_span if steady_span else 0.0,
            "most_over_cap_bytes": _most_over(ours, CAP_BYTES_PER_S),
            "cap_burst_s": CAP_BURST_S,
            "cap": CAP,
            "cap_bytes_per_s": CAP_BYTES_PER_S,
            "bytes_read": sum(a.bytes for a in ours),
            "first_call_bytes": ours[0].bytes if ours else 0,
            "data_calls": len(ours),
            "span_seconds": round(span, 2),
            "bytes_per_s": after_first / span if span else 0.0,
            "executor_span_seconds": round(exec_span, 2),
            "executor_bytes_per_s": sum(a.bytes for a in execs[1:]) / exec_span if exec_span else 0.0,
            "refused_source": refused["total"],
            "refused_by_reason": refused["by_reason"],
            "timeline": _timeline(proxy, shard, started),
        }


def _most_over(answers: list[Any], rate: float) -> float:
    """The most bytes any span of ``answers`` (in time order) took beyond ``rate`` over it: a
    cap's bucket keeps it at most its depth."""
    most = 0.0
    for i, first in enumerate(answers):
        taken = 0
        for a in answers[i:]:
            taken += a.bytes
            most = max(most, taken - rate * (a.call.at - first.call.at))
    return most


# -- the suite -----------------------------------------------------------------------------


def _print_catch_up(r: dict[str, Any]) -> None:
    w = _worst_shard(r)
    print(f"  catchup AvailableNow on {r.get('backend', 'moto')}, {r['shards']} shard(s), "
          f"{w['backlog_bytes'] / MIB:.1f} MiB each: executors read "
          f"{w['read_window_s']:.2f} s for {w['physical_s']:.2f} s physical = {r['read_ratio_worst']:.3f} (with the "
          f"first answer's {w['first_executor_answer_s']:.2f} s: {w['ratio_with_first_answer']:.3f}; whole query "
          f"{w['query_ratio']:.3f}); refused {r['refused_source']}; read {r['records_read']:,} of "
          f"{r['records_written']:,}; machine busy {w.get('machine_busy') or 0:.0%} (the busiest second "
          f"{w.get('machine_busy_peak') or 0:.0%}), busiest process "
          f"{w.get('busiest_process')}", flush=True)
    b = r.get("cpu_bound") or {}
    if b:
        print(f"    CPU: client {b['client_cores']:.2f} of {b['cores_left']:.2f} cores left by the servers "
              f"({b['ratio']:.2f}); {b['records_per_s']:,.0f} rec/s, the CPU allows "
              f"{b['allowed_records_per_s'] or 0:,.0f}; "
              f"client CPU s per GiB {r['cpu_s_per_gib']:.1f} vs raw loop {r['raw_loop']['cpu_s_per_gib']:.1f} "
              f"(refused {r['raw_loop']['refused']}, {r['raw_loop']['seconds']:.1f} s), floor "
              f"{r['floor_cpu_s_per_gib']:.1f}; {b['by_kind']}", flush=True)


def _print_neighbour(r: dict[str, Any]) -> None:
    print(f"  catchup beside a 1 MiB/s neighbour ({r['setting']}): source {r['source_bytes_per_s'] / MIB:.2f} MiB/s, "
          f"refused {r['source_refused']} ({_reasons(r['source_refused_by_reason'])}); neighbour refused "
          f"{r['neighbour_refused']} of {r['neighbour_calls']} ({_reasons(r['neighbour_refused_by_reason'])}); "
          f"server 5xx {len(r['server_failures'])}", flush=True)


def _print_cap(r: dict[str, Any]) -> None:
    print(f"  catchup maxReadRatePerShard={r['cap']}: {r['bytes_per_s'] / MIB:.3f} MiB/s, refused "
          f"{r['refused_source']}", flush=True)


def run_suite(spark: Any, url: str, quick: bool) -> dict[str, Any]:
    """The three cases (see the module docstring), printed as they finish."""
    per_shard = QUICK_CATCHUP_RECORDS if quick else CATCHUP_RECORDS
    runs = []
    for backend in BACKENDS:
        for shards in QUICK_SHARD_COUNTS if quick else SHARD_COUNTS:
            r = catch_up(spark, url, shards, per_shard, backend)
            _print_catch_up(r)
            runs.append(r)
    neighbours = []
    capped_extra = {"maxReadRatePerShard": "1MiB"}
    for setting, extra, run_s in (("default", {}, NEIGHBOUR_RUN_S),
                                  ("maxReadRatePerShard=1MiB", capped_extra, CAPPED_NEIGHBOUR_RUN_S)):
        run_s = QUICK_NEIGHBOUR_RUN_S if quick else run_s
        backlog = 1.1 * run_s + 20  # MiB: neither reader reaches its end
        r = beside_neighbour(spark, url, run_s, backlog, extra, setting)
        _print_neighbour(r)
        neighbours.append(r)
    cap = capped(spark, url, QUICK_CAP_RUN_S if quick else CAP_RUN_S,
                 QUICK_CAP_BACKLOG_MIB if quick else CAP_BACKLOG_MIB)
    _print_cap(cap)
    return {"record_bytes": RECORD_BYTES, "catch_up": runs, "neighbour": neighbours, "cap": cap,
            "skip_seconds": SKIP_S}


def main() -> None:
    """Command-line entry point."""
    from benchmarks import spark_env

    spark_env.suite_main(__doc__, run_suite)


if __name__ == "__main__":
    main()
