"""Put-to-sink latency and each shard's batch period, polling against enhanced fan-out (issue 22),
on moto behind the event-stream test server of ``tests/support/efo_server.py`` with Kinesis'
subscription rules on (a shard's next ``SubscribeToShard`` of one consumer is refused within 5 s
of its last, and more than one call a second is refused).

A producer writes ``RATE`` records a second to each of ``SHARDS`` shards (one ``PutRecords``
call per round, a record per shard by explicit hash key); each record's data is the time just
before its call (epoch seconds). The query (Spark's default trigger, ``initialPosition=LATEST``,
default options but endpoints, credentials and ``consumerMode``) writes into ``foreachBatch``,
which collects the batch's rows: a row's *latency* is the time its batch was collected less its
put time. A shard's *batch period* is the time between two batches that held its rows. Both are
measured over ``MEASURE_S`` (``--quick``: ``QUICK_MEASURE_S``), ``WARMUP_S`` after every shard's
first rows reached the sink. With fan-out
the server's refused subscriptions in that window are counted too. Every call of the query goes
to that server, so the window's ``GetRecords`` and ``GetShardIterator`` are counted there, driver
and executors together: fan-out runs twice, with its tip watches (the default) and with
``efoTipWatch=false`` (the driver probes with ``GetRecords``).

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


class Producer:
    """Writes a record a round to each shard, ``RATE`` rounds a second, stamped with the time
    of its ``PutRecords`` call."""

    def __init__(self, client: Any, stream: str, keys: list[tuple[str, str]]) -> None:
        self._client, self._stream, self._keys = client, stream, keys
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
            for rec in records:
                rec["Data"] = f"{stamp:.6f}".encode()
            self._client.put_records(StreamName=self._stream, Records=records)
            self.sent += len(records)
            n += 1
            self._stop.wait(max(0.0, 1.0 / RATE - (time.monotonic() - began)))

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
        got = df.select("shardId", "data").collect()
        now = time.time()
        with self._lock:
            self.rows.extend((now, r.shardId, float(bytes(r.data).decode())) for r in got)

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


def _bytes(query: Any) -> dict[str, int]:
    """The data bytes the executors reported receiving so far and, of them, outside their ranges
    (with fan-out: what the tip watches received), from the source's last progress."""
    from tests.support.spark_query import source_report

    report = source_report(query.lastProgress) if query.lastProgress else {}
    return {"read": report.get("executorBytesRead", 0), "extra": report.get("executorBytesExtra", 0)}


def measure(spark: Any, url: str, mode: str, measure_s: float, **extra: str) -> dict[str, Any]:
    """One mode's run on a fresh stream, behind a fresh event-stream server."""
    from tests.support.efo_server import EfoServer

    client = settings(url).boto3_client("kinesis")
    label = mode + "".join(f"-{k}={v}" for k, v in extra.items())
    stream = create_stream(client, SHARDS, f"latency-{mode}{'-' + str(len(extra)) if extra else ''}")
    keys = shard_hash_keys(client, stream)
    checkpoint = tempfile.mkdtemp(prefix="kddb-latency-")
    with EfoServer(url, activation_delay_s=1.0) as server:
        server.in_use_window_s, server.min_call_gap_s = 5.0, 1.0  # as Kinesis
        options = source_options(server.url, stream, initialPosition="LATEST", consumerMode=mode, **extra)
        options["dynamodbEndpointUrl"] = url
        sink = Sink()
        reader = spark.readStream.format("kinesis-ddb")
        for key, value in options.items():
            reader = reader.option(key, value)
        query = reader.load().writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint).start()
        try:
            with Producer(client, stream, keys):
                # the query starts (registers its consumer, finds the tips) and every shard
                # delivers; then WARMUP_S more, so the window holds steady state only
                wait_for(lambda: sink.delivered_after(0.0) == SHARDS, timeout=180,
                         what="every shard's first rows")
                time.sleep(WARMUP_S)
                since = time.time()
                refused_before = dict(server.refused)
                subscribed_before = server.subscriptions
                called_before = server.calls.get("SubscribeToShard", 0)
                polled_before = {op: server.calls.get(op, 0) for op in POLLED}
                bytes_before = _bytes(query)
                time.sleep(measure_s)  # the measured window
                until = time.time()
                refused = {k: v - refused_before.get(k, 0) for k, v in server.refused.items()}
                subscriptions = server.subscriptions - subscribed_before
                calls = server.calls.get("SubscribeToShard", 0) - called_before
                polled = {op: server.calls.get(op, 0) - polled_before[op] for op in POLLED}
                received = {k: v - bytes_before[k] for k, v in _bytes(query).items()}
                # a shard's rows arrive in order: once one put after the window is in, all of
                # the window's are
                wait_for(lambda: sink.delivered_after(until) == SHARDS, timeout=120,
                         what="the window's last rows")
            rows = sink.window(since, until)
        finally:
            query.stop()
            shutil.rmtree(checkpoint, ignore_errors=True)
    out = {"mode": label, "shards": SHARDS, "polled": polled, "bytes": received, "rate_per_shard": RATE,
           "seconds": round(until - since, 1),
           "refused": refused, "subscriptions": subscriptions, "subscribe_calls": calls, **_figures(rows)}
    print(f"  {label}: {out['rows']} rows, latency p50 {out['latency_ms']['p50']:.0f} ms p95 "
          f"{out['latency_ms']['p95']:.0f} ms, batch period p50 {out['batch_period_s']['p50']:.2f} s, "
          f"SubscribeToShard calls {calls} ({subscriptions} subscribed, refused {refused}); {polled}")
    return out


def run_suite(spark: Any, url: str, quick: bool) -> dict[str, Any]:
    """Polling, then fan-out with and without tip watches, each on its own stream and server."""
    measure_s = QUICK_MEASURE_S if quick else MEASURE_S
    return {"polling": measure(spark, url, "polling", measure_s),
            "efo": measure(spark, url, "efo", measure_s),
            "efo_probes": measure(spark, url, "efo", measure_s, efoTipWatch="false")}


if __name__ == "__main__":
    from benchmarks.spark_env import suite_main

    suite_main(__doc__ or "", run_suite)
