"""Put-to-sink latency and each shard's batch period, polling against enhanced fan-out (issues 22
and 49), on moto behind the event-stream test server of ``tests/support/efo_server.py`` with
Kinesis' subscription rules on (a shard's next ``SubscribeToShard`` of one consumer is refused
within 5 s of its last, and more than one call a second is refused). The server runs in a
process of its own: in the benchmark's, a hundred subscriptions' threads slowed the producer's
calls, whose stamps then measured the harness.

A producer writes ``RATE`` records a second to each of ``SHARDS`` shards (one ``PutRecords``
call per round through the event-stream server, which wakes its subscriptions at each write, a
record per shard by explicit hash key); each record's data is the time just
before its call (epoch seconds), padded to ``size`` bytes. The query (Spark's default trigger,
``initialPosition=LATEST``, default options but endpoints, credentials and ``consumerMode``)
writes into ``foreachBatch``, which collects the batch's rows: a row's *latency* is the time its
batch was collected less its put time. A shard's *batch period* is the time between two batches
that held its rows. Both are measured over ``MEASURE_S`` (``--quick``: ``QUICK_MEASURE_S``),
``WARMUP_S`` after every shard's first rows reached the sink. Every call of the query goes to
the event-stream server, so the window's ``GetRecords``, ``GetShardIterator``, subscriptions
and refusals are counted there, driver and executors together, and so are the data bytes it
pushed to subscribers: *received / delivered* is those bytes over the data bytes of the rows put
in the window. Fan-out runs with the driver's subscriptions (``efoSubscriptions=query``, the
default) and with a subscription per range (``efoSubscriptions=range``); the planning helper's
CPU seconds over the window are reported per MiB received.

Scenarios (``run_suite``): 4 shards at 10 records/s; 100 shards of which 10 written; 4 shards at
1 MiB/s each (64 KiB records); and the 4-shard case on ``local-cluster[2,1,1024]``
(``--only latency_cluster``).

    python -m benchmarks.latency [--quick]
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from typing import Any

from benchmarks.common import create_stream, settings, shard_hash_keys, source_options
from tests.support.waiting import wait_for

SHARDS = 4
RATE = 10  # records a second per shard
WARMUP_S = 10.0  # after every shard's first rows
MEASURE_S = 90.0
QUICK_MEASURE_S = 30.0
MIB = 1 << 20


class Producer:
    """Writes a record a round to each shard of ``keys``, ``rate`` rounds a second, stamped with
    the time of its ``PutRecords`` call and padded to ``size`` bytes."""

    def __init__(self, client: Any, stream: str, keys: list[tuple[str, str]], rate: float = RATE,
                 size: int = 0) -> None:
        self._client, self._stream, self._keys = client, stream, keys
        self._rate, self._size = rate, size
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.sent = 0

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            began = time.monotonic()
            records = [{"Data": b"", "PartitionKey": f"k{n}-{i}", "ExplicitHashKey": key}
                       for i, (_, key) in enumerate(self._keys)]
            stamp = time.time()  # the data cannot hold when the call returns: a few ms early
            data = f"{stamp:.6f}|".encode().ljust(self._size, b".")
            for rec in records:
                rec["Data"] = data
            self._client.put_records(StreamName=self._stream, Records=records)
            self.sent += len(records)
            n += 1
            self._stop.wait(max(0.0, 1.0 / self._rate - (time.monotonic() - began)))

    def __enter__(self) -> Producer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(10)


class Sink:
    """``foreachBatch``: collects each batch and keeps (collected at, shard, put time) rows."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, str, float]] = []
        self._lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        got = df.selectExpr("shardId", "substring(data, 1, 24) AS stamp").collect()
        now = time.time()
        with self._lock:
            self.rows.extend((now, r.shardId, float(bytes(r.stamp).split(b"|")[0])) for r in got)

    def delivered_after(self, put: float) -> int:
        """How many shards delivered a row put after ``put``."""
        with self._lock:
            return len({shard for _, shard, at in self.rows if at > put})

    def window(self, since: float, until: float) -> list[tuple[float, str, float]]:
        with self._lock:
            return [r for r in self.rows if since <= r[2] < until]


def _percentiles(values: list[float]) -> dict[str, Any]:
    """p50, p95 and max (nearest rank), and how many values."""
    vals = sorted(values)
    if not vals:
        return {"p50": None, "p95": None, "max": None, "n": 0}

    def rank(q: float) -> float:
        return round(vals[min(len(vals) - 1, max(0, int(q * len(vals) + 0.5) - 1))], 3)

    return {"p50": rank(0.5), "p95": rank(0.95), "max": round(vals[-1], 3), "n": len(vals)}


def _figures(rows: list[tuple[float, str, float]]) -> dict[str, Any]:
    latency = [(at - put) * 1000 for at, _, put in rows]
    periods: list[float] = []
    by_shard: dict[str, list[float]] = {}
    for at, shard, _ in rows:
        by_shard.setdefault(shard, []).append(at)
    for times in by_shard.values():
        batches = sorted(set(times))
        periods += [b - a for a, b in zip(batches, batches[1:], strict=False)]
    return {"rows": len(rows), "latency_ms": _percentiles(latency), "batch_period_s": _percentiles(periods)}


POLLED = ("GetRecords", "GetShardIterator")


def _calls(counters: dict[str, Any], op: str) -> int:
    return int(counters["calls"].get(op, 0))


def _helper_cpu(query: Any) -> float:
    """The planning helper's CPU seconds so far, from the source's last progress."""
    from tests.support.spark_query import source_report

    return float(source_report(query.lastProgress).get("helperCpuS", 0.0)) if query.lastProgress else 0.0


def measure(spark: Any, url: str, mode: str, measure_s: float, shards: int = SHARDS, active: int | None = None,
            rate: float = RATE, size: int = 0, poll_s: float = 5.0, **extra: str) -> dict[str, Any]:
    """One mode's run on a fresh stream, behind a fresh event-stream server: ``active`` of the
    ``shards`` written, through that server (each write wakes its subscriptions; one with
    nothing new looks at moto again every ``poll_s`` and sends an empty event, as Kinesis does
    now and then on an idle shard; at 0.5 s, a hundred idle subscriptions' 200 GetRecords a
    second to moto took the CPU the producer and the query needed)."""
    from tests.support.efo_process import EfoServerProcess

    client = settings(url).boto3_client("kinesis")
    label = mode + "".join(f"-{k}={v}" for k, v in extra.items())
    stream = create_stream(client, shards, f"latency-{mode}-{shards}-{len(extra)}-{size}")
    keys = shard_hash_keys(client, stream)[:active or shards]
    checkpoint = tempfile.mkdtemp(prefix="kddb-latency-")
    as_kinesis = {"in_use_window_s": 5.0, "min_call_gap_s": 1.0}
    with EfoServerProcess(url, as_kinesis, activation_delay_s=1.0, poll_interval_s=poll_s) as server:
        options = source_options(server.url, stream, initialPosition="LATEST", consumerMode=mode, **extra)
        options["dynamodbEndpointUrl"] = url
        sink = Sink()
        reader = spark.readStream.format("kinesis-ddb")
        for key, value in options.items():
            reader = reader.option(key, value)
        query = reader.load().writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint).start()
        try:
            writer = settings(server.url).boto3_client("kinesis")
            with Producer(writer, stream, keys, rate, size) as producer:
                # the query starts (registers its consumer, finds the tips) and every shard
                # delivers; then WARMUP_S more, so the window holds steady state only
                wait_for(lambda: sink.delivered_after(0.0) == len(keys), timeout=300,
                         what="every shard's first rows")
                time.sleep(WARMUP_S)
                since = time.time()
                before, put_before = server.counters(), producer.sent
                cpu_before = _helper_cpu(query)
                time.sleep(measure_s)  # the measured window
                until = time.time()
                after = server.counters()
                refused = {k: v - before["refused"].get(k, 0) for k, v in after["refused"].items()}
                subscriptions = after["subscriptions"] - before["subscriptions"]
                calls = _calls(after, "SubscribeToShard") - _calls(before, "SubscribeToShard")
                polled = {op: _calls(after, op) - _calls(before, op) for op in POLLED}
                pushed = after["sent_bytes"] - before["sent_bytes"]
                put = producer.sent - put_before
                cpu = _helper_cpu(query) - cpu_before
                # a shard's rows arrive in order: once one put after the window is in, all of
                # the window's are
                wait_for(lambda: sink.delivered_after(until) == len(keys), timeout=120,
                         what="the window's last rows")
            rows = sink.window(since, until)
            record_bytes = len(f"{time.time():.6f}|".encode().ljust(size, b"."))
        finally:
            query.stop()
            shutil.rmtree(checkpoint, ignore_errors=True)
    delivered = put * record_bytes
    out = {"mode": label, "shards": shards, "active": len(keys), "polled": polled, "rate_per_shard": rate,
           "record_bytes": record_bytes, "seconds": round(until - since, 1),
           "received_bytes": pushed, "delivered_bytes": delivered,
           "received_per_delivered": round(pushed / delivered, 3) if delivered and mode == "efo" else None,
           "helper_cpu_s": round(cpu, 2),
           "helper_cpu_s_per_mib": round(cpu / (pushed / MIB), 3) if pushed else None,
           "refused": refused, "subscriptions": subscriptions, "subscribe_calls": calls, **_figures(rows)}
    print(f"  {label} ({shards} shards, {len(keys)} written, {rate}/s of {record_bytes} B): {out['rows']} rows, "
          f"latency p50 {out['latency_ms']['p50']:.0f} ms p95 {out['latency_ms']['p95']:.0f} ms, batch period "
          f"p50 {out['batch_period_s']['p50']:.2f} s, SubscribeToShard calls {calls} ({subscriptions} subscribed, "
          f"refused {refused}); {polled}; received/delivered {out['received_per_delivered']}, helper CPU "
          f"{cpu:.1f} s")
    return out


CLUSTER_MASTER = "local-cluster[2,1,1024]"


def run_cluster_suite(spark: Any, url: str, quick: bool) -> dict[str, Any]:
    """Polling and fan-out at 4 shards on ``CLUSTER_MASTER`` (two executor JVMs)."""
    measure_s = QUICK_MEASURE_S if quick else MEASURE_S
    return {"master": CLUSTER_MASTER, "polling": measure(spark, url, "polling", measure_s),
            "efo": measure(spark, url, "efo", measure_s)}


def run_suite(spark: Any, url: str, quick: bool) -> dict[str, Any]:
    """Polling and both kinds of fan-out at 4 shards; fan-out and polling at 100 shards (10
    written) and at 1 MiB/s a shard; each on its own stream and server."""
    measure_s = QUICK_MEASURE_S if quick else MEASURE_S
    wide = {"shards": 100, "active": 10}
    fast = {"rate": 16, "size": 64 * 1024}
    return {"polling": measure(spark, url, "polling", measure_s),
            "efo": measure(spark, url, "efo", measure_s),
            "efo_range": measure(spark, url, "efo", measure_s, efoSubscriptions="range"),
            "polling_100": measure(spark, url, "polling", measure_s, **wide),
            "efo_100": measure(spark, url, "efo", measure_s, **wide),
            "polling_1mib": measure(spark, url, "polling", measure_s, **fast),
            "efo_1mib": measure(spark, url, "efo", measure_s, **fast)}


if __name__ == "__main__":
    from benchmarks.spark_env import suite_main

    suite_main(__doc__ or "", run_suite)
