"""Catch-up: reading a backlog at the shard's physical read limit, never throttled (issue 20), on
moto behind the quota-enforcing proxy of ``tests/support/quota.py`` (5 ``GetRecords`` a second
and a 2 MiB/s byte bucket 10 MiB deep per shard, every caller together).

Records are ``RECORD_BYTES`` bytes of data with a partition key of one to two characters; bytes
are counted as Kinesis and the proxy count them (data and partition key). The proxy here
(:class:`MeteredProxy`) also keeps the bytes of every ``GetRecords`` answer, so that each call
of the source is known with its time (arrival at the proxy), shard, caller and bytes.

1. **Catch-up** (``Trigger.AvailableNow``, ``initialPosition=TRIM_HORIZON``, ``noop`` sink,
   default options but endpoints and credentials): every shard holds a backlog of
   ``CATCHUP_RECORDS`` records (>= 25 MiB; ``--quick``: ``QUICK_CATCHUP_RECORDS``, ~15 MiB),
   written with ``PutRecords`` batches of 500 straight to moto before the query starts. Per
   shard, the *read window* runs from the source's first to its last ``GetRecords`` that
   returned records (driver probes and executor reads together). A reader can do no better than
   take the full 10 MiB bucket at once and then 2 MiB/s, so the *physical limit* is
   ``(backlog bytes - 10 MiB) / 2 MiB/s``; the figure is physical / window (the worst shard's),
   the source's refused calls, and the rows read against the records written. 1 shard
   (``--quick``: only this), 4 and 16 shards.
2. **Neighbour**: one shard, and another application (access key ``neighbour``, boto3 without
   retries) reading it from ``TRIM_HORIZON`` once a second with a ``Limit`` of ~1 MiB of
   records, counting its refusals; ``NEIGHBOUR_LEAD_S`` later the source's query starts (Spark's
   default trigger, ``TRIM_HORIZON``) and both run for ``NEIGHBOUR_RUN_S`` (``--quick``: 30 s).
   So that neither reader reaches the tip, the shard holds a backlog of
   ``NEIGHBOUR_BACKLOG_MIB`` and a producer (:class:`~tests.support.quota.Feeder`) writes
   ~1 MiB/s into it during the run: moto fills ~8 MiB/s, so a backlog big enough for 90 s of
   both readers alone (~200 MiB) would take longer to write than the run. Figures: the source's
   bytes/s from 10 s after its first data call to the end (the neighbour's 1 MiB/s leaves it
   ~1 MiB/s), the neighbour's refusals and the source's refusals per minute. Run twice:
   default options, and ``maxReadRatePerShard=1MiB``.
3. **Cap**: ``maxReadRatePerShard=0.5MiB``, one shard with a ``CAP_BACKLOG_MIB`` backlog, a
   timed run of ``CAP_RUN_S`` (default trigger): the rate is the bytes of the source's data
   calls after its first / (last data call - first data call).

    python -m benchmarks.catchup [--quick]
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from benchmarks.common import PUT_BATCH, REGION, create_stream, settings, shard_hash_keys, source_options
from benchmarks.quota import _rows_read
from tests.support.proxy import THROTTLED, Seen
from tests.support.quota import Feeder, QuotaProxy, _data_bytes

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
QUICK_SHARD_COUNTS = (1,)
CATCHUP_TIMEOUT_S = 600.0

NEIGHBOUR_RUN_S, QUICK_NEIGHBOUR_RUN_S = 90.0, 30.0
NEIGHBOUR_BACKLOG_MIB, QUICK_NEIGHBOUR_BACKLOG_MIB = 80, 30
NEIGHBOUR_BYTES_PER_S = 1 * MIB
NEIGHBOUR_LEAD_S = 3.0  # the neighbour reads alone this long before the query starts
PRODUCER_BYTES_PER_S = 1 * MIB
PRODUCER_ROUNDS_PER_S = 4
SKIP_S = 10.0  # the source's rate beside the neighbour: from this long after its first data call

CAP = "0.5MiB"
CAP_BYTES_PER_S = 0.5 * MIB
CAP_BACKLOG_MIB, QUICK_CAP_BACKLOG_MIB = 20, 12
CAP_RUN_S, QUICK_CAP_RUN_S = 40.0, 20.0


@dataclass(frozen=True)
class Answer:
    """One ``GetRecords`` answered by the server: the call, and what it carried."""

    call: Seen
    bytes: int
    records: int
    done: float  # time.monotonic() when the answer was read from the server


class MeteredProxy(QuotaProxy):
    """The quota proxy, also keeping each ``GetRecords`` answer's bytes (:class:`Answer`)."""

    def __init__(self, target_url: str) -> None:
        super().__init__(target_url)
        self.answers: list[Answer] = []
        self.failures: list[tuple[Seen, int, str]] = []  # the server's 5xx answers

    def _transform(self, call: Seen, body: bytes, status: int, data: bytes) -> bytes:
        data = super()._transform(call, body, status, data)
        if status >= 500:
            with self._lock:
                self.failures.append((call, status, data[:200].decode(errors="replace")))
        if call.operation == "GetRecords" and status == 200 and call.shard is not None:
            resp = json.loads(data)
            answer = Answer(call, _data_bytes(resp), len(resp.get("Records", [])), time.monotonic())
            with self._lock:
                self.answers.append(answer)
        return data

    def data_calls(self, key: str, shard: str | None = None) -> list[Answer]:
        """``key``'s answers with records (of ``shard``), by arrival."""
        with self._lock:
            out = [a for a in self.answers if a.call.access_key == key and a.records
                   and (shard is None or a.call.shard[1] == shard)]  # type: ignore[index]
        return sorted(out, key=lambda a: a.call.at)

    def refusals(self, key: str, shard: str | None = None, since: float = 0.0,
                 until: float = float("inf")) -> list[Seen]:
        """``key``'s calls a quota refused (about ``shard``), between the two times."""
        return [s for s in self.calls(where=lambda s: s.access_key == key and since <= s.at <= until
                                      and (shard is None or (s.shard is not None and s.shard[1] == shard)),
                                      refused=True)]


def _timeline(proxy: MeteredProxy, shard: str, t0: float, keys: tuple[str, ...] = (SOURCE_KEY,)) -> list[list[Any]]:
    """Every ``GetRecords`` of ``keys`` on ``shard`` as ``[seconds after t0, who, bytes, records,
    seconds after t0 its answer was read]`` (``who``: driver, executor or neighbour; bytes
    ``"refused"`` for a refusal)."""
    answered = {id(a.call): a for a in proxy.answers}

    def who(s: Seen) -> str:
        if s.access_key != SOURCE_KEY:
            return str(s.access_key)
        return "driver" if s.client == "async" else "executor"

    out = []
    for s in proxy.calls("GetRecords", where=lambda s: s.access_key in keys and s.shard is not None
                         and s.shard[1] == shard):
        a = answered.get(id(s))
        if s.injected == THROTTLED:
            out.append([round(s.at - t0, 3), who(s), "refused", 0, None])
        elif a is not None:
            out.append([round(s.at - t0, 3), who(s), a.bytes, a.records, round(a.done - t0, 3)])
    return out


def _key(i: int) -> str:
    return str(i % 100)  # a short partition key: one or two characters


def _fill(client: Any, stream: str, keys: list[tuple[str, str]], per_shard: int) -> dict[str, int]:
    """``per_shard`` records of ``RECORD_BYTES`` in every shard (``PutRecords`` of 500, each to
    one shard); returns each shard's bytes as Kinesis counts them (data and partition keys)."""
    payload = os.urandom(RECORD_BYTES)
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


def _start(spark: Any, options: dict[str, str], checkpoint: str, available_now: bool) -> Any:
    reader = spark.readStream.format("kinesis-ddb")
    for key, value in options.items():
        reader = reader.option(key, value)
    writer = reader.load().writeStream.format("noop").option("checkpointLocation", checkpoint)
    if available_now:
        writer = writer.trigger(availableNow=True)
    return writer.start()


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


def catch_up(spark: Any, url: str, shards: int, per_shard: int) -> dict[str, Any]:
    """One ``Trigger.AvailableNow`` run over a backlog of ``per_shard`` records per shard."""
    client, stream, keys = _stream(url, shards, "catchup")
    began = time.monotonic()
    backlog = _fill(client, stream, keys, per_shard)
    fill_s = time.monotonic() - began
    checkpoint = tempfile.mkdtemp(prefix="kddb-catchup-")
    with MeteredProxy(url) as proxy:
        started = time.monotonic()
        query = _start(spark, _options(proxy, url, stream), checkpoint, available_now=True)
        try:
            if not query.awaitTermination(CATCHUP_TIMEOUT_S):
                raise TimeoutError(f"AvailableNow over {shards} shard(s): not done in {CATCHUP_TIMEOUT_S:.0f} s")
            if query.exception() is not None:
                raise RuntimeError(f"the query failed: {query.exception()}")
            ended = time.monotonic()
            rows = _rows_read(query)
            progress = [json.loads(p.json) for p in query.recentProgress]
        finally:
            query.stop()
            shutil.rmtree(checkpoint, ignore_errors=True)
        per = []
        for shard, _ in keys:
            calls = proxy.data_calls(SOURCE_KEY, shard)
            window = calls[-1].call.at - calls[0].call.at if len(calls) > 1 else 0.0
            physical = max(0.0, backlog[shard] - BURST_BYTES) / SHARD_BYTES_PER_S
            read = sum(a.bytes for a in calls)
            execs = [a for a in calls if a.call.client == "sync"]
            exec_window = execs[-1].call.at - execs[0].call.at if len(execs) > 1 else 0.0
            per.append({
                "shard": shard,
                "backlog_bytes": backlog[shard],
                "bytes_read": read,
                "data_calls": len(calls),
                "driver_data_calls": sum(1 for a in calls if a.call.client == "async"),
                "first_call_bytes": calls[0].bytes if calls else 0,
                "first_data_call_s": round(calls[0].call.at - started, 3) if calls else None,
                "window_s": round(window, 3),
                "physical_s": round(physical, 3),
                "ratio": physical / window if window else 0.0,
                "first_executor_call_s": round(execs[0].call.at - started, 3) if execs else None,
                "executor_window_s": round(exec_window, 3),
                "executor_first_call_bytes": execs[0].bytes if execs else 0,
                # (what the executors alone achieved: their bytes after their first call at 2 MiB/s)
                "executor_ideal_s": round(sum(a.bytes for a in execs[1:]) / SHARD_BYTES_PER_S, 3),
                "refused": len(proxy.refusals(SOURCE_KEY, shard)),
                "get_records_calls": len(proxy.calls("GetRecords", where=lambda s, sh=shard: s.access_key == SOURCE_KEY
                                                     and s.shard is not None and s.shard[1] == sh)),
            })
        worst = min(per, key=lambda p: p["ratio"])
        t0 = min((p["first_data_call_s"] or 0.0) for p in per) + started
        out = {
            "shards": shards,
            "records_per_shard": per_shard,
            "records_written": per_shard * shards,
            "records_read": rows,
            "batches": sum(1 for p in progress if p["numInputRows"] > 0),
            "batch_duration_ms": [p["durationMs"] for p in progress if p["numInputRows"] > 0],
            "fill_seconds": round(fill_s, 1),
            "query_seconds": round(ended - started, 1),
            "ratio_worst": worst["ratio"],
            "ratio_median": sorted(p["ratio"] for p in per)[len(per) // 2],
            "refused_source": len(proxy.refusals(SOURCE_KEY)),
            "refused_by_op": _refused_by_op(proxy, SOURCE_KEY),
            "server_failures": _failures(proxy, started),
            "per_shard": per,
            # the worst shard's calls, for reading what happened
            "timeline_worst_shard": _timeline(proxy, worst["shard"], t0),
        }
    return out


def _failures(proxy: MeteredProxy, t0: float) -> list[list[Any]]:
    """The server's 5xx answers: ``[seconds after t0, operation, caller, status, body's start]``."""
    with proxy._lock:
        return [[round(c.at - t0, 2), c.operation, c.access_key, status, text]
                for c, status, text in proxy.failures]


def _refused_by_op(proxy: MeteredProxy, key: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in proxy.refusals(key):
        out[s.operation] = out.get(s.operation, 0) + 1
    return out


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


def _backlog_records(mib: float) -> int:
    return int(mib * MIB / (RECORD_BYTES + 2))


def beside_neighbour(spark: Any, url: str, run_s: float, backlog_mib: float,
                     extra: dict[str, str], setting: str) -> dict[str, Any]:
    """The source's query catching up beside :class:`ShardNeighbour` for ``run_s``."""
    client, stream, keys = _stream(url, 1, "catchup-nb")
    shard = keys[0][0]
    backlog = _fill(client, stream, keys, _backlog_records(backlog_mib))[shard]
    checkpoint = tempfile.mkdtemp(prefix="kddb-catchup-")
    per_round = round(PRODUCER_BYTES_PER_S / PRODUCER_ROUNDS_PER_S / (RECORD_BYTES + 1))
    with MeteredProxy(url) as proxy, \
            Feeder(client, stream, [shard], PRODUCER_ROUNDS_PER_S, RECORD_BYTES, per_round) as producer, \
            ShardNeighbour(proxy.url, stream, shard, NEIGHBOUR_BYTES_PER_S, RECORD_BYTES + 2) as neighbour:
        time.sleep(NEIGHBOUR_LEAD_S)
        started = time.monotonic()
        query = _start(spark, _options(proxy, url, stream, **extra), checkpoint, available_now=False)
        try:
            while time.monotonic() < started + run_s:
                if not query.isActive:
                    raise RuntimeError(f"the query stopped: {query.exception()}")
                time.sleep(0.5)
            ended = time.monotonic()
            rows = _rows_read(query)
        finally:
            query.stop()
            shutil.rmtree(checkpoint, ignore_errors=True)
        neighbour.__exit__(None, None, None)
        producer.__exit__(None, None, None)
        ours = [a for a in proxy.data_calls(SOURCE_KEY) if a.call.at <= ended]
        theirs = [a for a in proxy.data_calls(NEIGHBOUR_KEY) if started <= a.call.at <= ended]
        first = ours[0].call.at if ours else ended
        since = first + SKIP_S
        measured = [a for a in ours if a.call.at >= since]
        ours_refused = proxy.refusals(SOURCE_KEY, until=ended)
        out = {
            "setting": setting,
            "options": extra,
            "run_seconds": round(ended - started, 1),
            "backlog_bytes": backlog,
            "produced_bytes_per_s": per_round * (RECORD_BYTES + 1) * PRODUCER_ROUNDS_PER_S,
            "records_produced": len(producer.sent),
            "first_data_call_s": round(first - started, 2),
            "measured_seconds": round(ended - since, 1),
            "source_bytes_per_s": sum(a.bytes for a in measured) / (ended - since) if ended > since else 0.0,
            "source_bytes_per_s_from_first": sum(a.bytes for a in ours) / (ended - first) if ended > first else 0.0,
            "source_bytes": sum(a.bytes for a in ours),
            "source_data_calls": len(ours),
            "rows_read": rows,
            "neighbour_limit": neighbour.limit,
            "neighbour_calls": neighbour.calls,
            "neighbour_refused": neighbour.refused,
            "neighbour_refused_proxy": len(proxy.refusals(NEIGHBOUR_KEY)),
            "neighbour_errors": neighbour.errors,
            "neighbour_errors_at_s": [round(t - started, 2) for t in neighbour.error_times],
            "server_failures": _failures(proxy, started),
            "neighbour_bytes_per_s": sum(a.bytes for a in theirs) / (ended - started),
            "source_refused": len(ours_refused),
            "source_refused_by_op": _refused_by_op(proxy, SOURCE_KEY),
            "source_refused_per_minute": len(ours_refused) / ((ended - started) / 60),
            "source_refused_at_s": [round(s.at - started, 2) for s in ours_refused],
            "neighbour_refused_at_s": [round(s.at - started, 2) for s in proxy.refusals(NEIGHBOUR_KEY)],
            "timeline": _timeline(proxy, shard, started, (SOURCE_KEY, NEIGHBOUR_KEY)),
        }
    return out


# -- 3. cap --------------------------------------------------------------------------------


def capped(spark: Any, url: str, run_s: float, backlog_mib: float) -> dict[str, Any]:
    """``maxReadRatePerShard=0.5MiB`` over one backlogged shard for ``run_s``."""
    client, stream, keys = _stream(url, 1, "catchup-cap")
    shard = keys[0][0]
    backlog = _fill(client, stream, keys, _backlog_records(backlog_mib))[shard]
    checkpoint = tempfile.mkdtemp(prefix="kddb-catchup-")
    with MeteredProxy(url) as proxy:
        started = time.monotonic()
        query = _start(spark, _options(proxy, url, stream, maxReadRatePerShard=CAP), checkpoint,
                       available_now=False)
        try:
            while time.monotonic() < started + run_s:
                if not query.isActive:
                    raise RuntimeError(f"the query stopped: {query.exception()}")
                time.sleep(0.5)
            ended = time.monotonic()
            rows = _rows_read(query)
        finally:
            query.stop()
            shutil.rmtree(checkpoint, ignore_errors=True)
        ours = [a for a in proxy.data_calls(SOURCE_KEY) if a.call.at <= ended]
        span = ours[-1].call.at - ours[0].call.at if len(ours) > 1 else 0.0
        after_first = sum(a.bytes for a in ours[1:])
        execs = [a for a in ours if a.call.client == "sync"]
        exec_span = execs[-1].call.at - execs[0].call.at if len(execs) > 1 else 0.0
        out = {
            "cap": CAP,
            "cap_bytes_per_s": CAP_BYTES_PER_S,
            "run_seconds": round(ended - started, 1),
            "backlog_bytes": backlog,
            "bytes_read": sum(a.bytes for a in ours),
            "first_call_bytes": ours[0].bytes if ours else 0,
            "data_calls": len(ours),
            "span_seconds": round(span, 2),
            "bytes_per_s": after_first / span if span else 0.0,
            "executor_span_seconds": round(exec_span, 2),
            "executor_bytes_per_s": sum(a.bytes for a in execs[1:]) / exec_span if exec_span else 0.0,
            "rows_read": rows,
            "refused_source": len(proxy.refusals(SOURCE_KEY)),
            "server_failures": _failures(proxy, started),
            "timeline": _timeline(proxy, shard, started),
        }
    return out


# -- the suite -----------------------------------------------------------------------------


def _print_catch_up(r: dict[str, Any]) -> None:
    w = min(r["per_shard"], key=lambda p: p["ratio"])
    print(f"  catchup AvailableNow {r['shards']} shard(s) x {r['records_per_shard']:,} records "
          f"({w['backlog_bytes'] / MIB:.1f} MiB each): worst shard window {w['window_s']:.2f} s, physical "
          f"{w['physical_s']:.2f} s, ratio {r['ratio_worst']:.3f} (median {r['ratio_median']:.3f}); "
          f"refused {r['refused_source']}; read {r['records_read']:,} of {r['records_written']:,}; "
          f"query {r['query_seconds']:.1f} s", flush=True)


def _print_neighbour(r: dict[str, Any]) -> None:
    print(f"  catchup beside a 1 MiB/s neighbour ({r['setting']}), {r['run_seconds']:.0f} s: source "
          f"{r['source_bytes_per_s'] / MIB:.2f} MiB/s after its first {SKIP_S:.0f} s "
          f"({r['source_bytes_per_s_from_first'] / MIB:.2f} from its first data call), refused "
          f"{r['source_refused']} ({r['source_refused_per_minute']:.2f}/min); neighbour "
          f"{r['neighbour_bytes_per_s'] / MIB:.2f} MiB/s, refused {r['neighbour_refused']} of "
          f"{r['neighbour_calls']}", flush=True)


def _print_cap(r: dict[str, Any]) -> None:
    print(f"  catchup maxReadRatePerShard={r['cap']}: {r['bytes_per_s'] / MIB:.3f} MiB/s over "
          f"{r['span_seconds']:.1f} s ({r['data_calls']} data calls, first {r['first_call_bytes']:,} B); "
          f"refused {r['refused_source']}", flush=True)


def run_suite(spark: Any, url: str, quick: bool) -> dict[str, Any]:
    """The three cases (see the module docstring), printed as they finish."""
    per_shard = QUICK_CATCHUP_RECORDS if quick else CATCHUP_RECORDS
    runs = []
    for shards in QUICK_SHARD_COUNTS if quick else SHARD_COUNTS:
        r = catch_up(spark, url, shards, per_shard)
        _print_catch_up(r)
        runs.append(r)
    run_s = QUICK_NEIGHBOUR_RUN_S if quick else NEIGHBOUR_RUN_S
    backlog = QUICK_NEIGHBOUR_BACKLOG_MIB if quick else NEIGHBOUR_BACKLOG_MIB
    neighbours = []
    for setting, extra in (("default", {}), ("maxReadRatePerShard=1MiB", {"maxReadRatePerShard": "1MiB"})):
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
