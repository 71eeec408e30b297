"""Quota: the source as a good citizen of every shard's read quota (issue 16), on moto behind the
quota-enforcing proxy of ``tests/support/quota.py``.

A Spark streaming query (default trigger, default options but endpoints and credentials,
``initialPosition=TRIM_HORIZON``, ``noop`` sink) reads a stream that a :class:`Feeder` writes at
``RATE`` records a second per shard, beside a *neighbour*: another application (its own access
key, no retries) reading every shard's tip once a second. Measured from the query's first batch
with records for ``MEASURE_S`` seconds, counting only the source's calls (its access key):

- the peak ``GetRecords`` and ``GetShardIterator`` calls per shard per second in any 10-second
  window (driver and executors together, as Kinesis counts them);
- the mean calls per shard per second, split driver (aiobotocore) / executors (boto3);
- calls the quotas refused, the source's and the neighbour's (over the whole run);
- records fed vs records read (``numInputRows``; the feeder stops after the measured window and
  the query must have read every record fed by the end of the idle phase).

Then the feeder stops; once the query has read every record fed (from then on its shards are
idle) it runs on for ``IDLE_S`` seconds: the driver's ``GetRecords`` per idle shard per minute
over the last ``IDLE_WINDOW_S`` of them (scaled to a minute). (Counting from the feeder's stop
put a slow catch-up's reads in the window: at 1,000 shards the driver's probes read the last
records for 13 s.)

At 1,000 shards (1 record a second per shard, full runs only) the same Spark run is tried within
``BIG_DEADLINE_S``; where it cannot run on this machine, the driver alone is measured instead:
:class:`~kinesis_source.driver.planner.Planner` driven directly as Spark drives it
(``latest_offset``, then ``hand_over`` of the batch's ranges, no executor reads) with the feeder
on, its calls counted on the proxy.

    python -m benchmarks.quota [--quick] [--shards 4,10,1000]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from benchmarks.common import REGION, close_planner, create_stream, local_env, settings, source_options
from tests.support.proxy import Seen
from tests.support.quota import Feeder, QuotaProxy

RATE = 50  # records per second per shard
BIG_SHARDS = 1000
BIG_RATE = 1
SOURCE_KEY = "local"  # the source's access key (source_options)
NEIGHBOUR_KEY = "neighbour"
WINDOW_S = 10.0  # the acceptance windows
NEIGHBOUR_S = 300.0  # full runs: how long the 4-shard query and its neighbour share the shards
FIRST_BATCH_TIMEOUT_S = 300.0
CATCH_UP_TIMEOUT_S = 120.0
BIG_DEADLINE_S = 600.0  # the whole 1,000-shard Spark run, or it is judged impractical here
PUT_BATCH = 500  # records per PutRecords: one Feeder per 500 shards
CLOSE_TIMEOUT_S = 120.0


class Neighbour:
    """Another application: reads every shard's tip once a second, without retries, so every
    refusal is seen. Shards are shared among ``threads`` threads, each polling its shards in
    turn once a second (it falls behind when the server cannot answer that fast: ``rounds``
    says how many it made)."""

    def __init__(self, url: str, stream: str, shards: list[str], threads: int = 1) -> None:
        self._client = boto3.client(
            "kinesis", endpoint_url=url, region_name=REGION, aws_access_key_id=NEIGHBOUR_KEY,
            aws_secret_access_key="local",
            config=Config(retries={"total_max_attempts": 1}, max_pool_connections=max(10, threads)),
        )
        self._stream = stream
        self._groups = [shards[i::threads] for i in range(threads)]
        self.threads = threads
        self.calls = 0
        self.refused = 0
        self.errors: list[str] = []
        self.rounds = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(g,), daemon=True) for g in self._groups]

    def _run(self, shards: list[str]) -> None:
        its = {}
        for shard in shards:
            its[shard] = self._client.get_shard_iterator(
                StreamName=self._stream, ShardId=shard, ShardIteratorType="LATEST")["ShardIterator"]
        while not self._stop.wait(1.0):  # once a second, as the neighbour is specified
            for shard in shards:
                refused = 0
                try:
                    its[shard] = self._client.get_records(ShardIterator=its[shard])["NextShardIterator"]
                except ClientError as exc:
                    code = exc.response["Error"]["Code"]
                    if code != "ProvisionedThroughputExceededException":
                        self.errors.append(code)
                    refused = 1
                with self._lock:
                    self.calls += 1
                    self.refused += refused
            with self._lock:
                self.rounds += 1

    def __enter__(self) -> Neighbour:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)


class Feeders:
    """:class:`Feeder` s writing ``rate`` records a second to every shard (one per 500 shards,
    PutRecords' limit)."""

    def __init__(self, client: Any, stream: str, shards: list[str], rate: float) -> None:
        self._feeders = [
            Feeder(client, stream, shards[i:i + PUT_BATCH], rate) for i in range(0, len(shards), PUT_BATCH)
        ]

    def fed(self) -> int:
        """Records written so far."""
        return sum(len(f.sent) for f in self._feeders)

    def put_at(self) -> dict[str, float]:
        """Each record's ``PutRecords`` call time, by sequence number."""
        return {seq: at for f in self._feeders for seq, at in f.put_at.items()}

    def __enter__(self) -> Feeders:
        for f in self._feeders:
            f.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        for f in self._feeders:
            f.__exit__(*exc)


def _shard_ids(client: Any, stream: str) -> list[str]:
    out, kwargs = [], {"StreamName": stream}
    while True:
        resp = client.list_shards(**kwargs)
        out += [s["ShardId"] for s in resp["Shards"]]
        if not resp.get("NextToken"):
            return out
        kwargs = {"NextToken": resp["NextToken"]}


def _start(spark: Any, options: dict[str, str], checkpoint: str) -> Any:
    """The query, Spark's default trigger, ``noop`` sink."""
    reader = spark.readStream.format("kinesis-ddb")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load().writeStream.format("noop").option("checkpointLocation", checkpoint).start()


def _rows_read(query: Any) -> int:
    return sum(json.loads(p.json)["numInputRows"] for p in query.recentProgress)


def _batches(query: Any) -> int:
    """Batches with records so far (progress events are kept: numRecentProgressUpdates)."""
    return sum(1 for p in query.recentProgress if json.loads(p.json)["numInputRows"] > 0)


def _wait(cond: Callable[[], bool], timeout: float, what: str, query: Any = None) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if query is not None and not query.isActive:
            raise RuntimeError(f"the query stopped while waiting for {what}: {query.exception()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.2)


class _Clock:
    """Deadline of a whole run: raises once past it."""

    def __init__(self, limit_s: float | None) -> None:
        self.began = time.monotonic()
        self.limit = limit_s

    def left(self, want: float) -> float:
        if self.limit is None:
            return want
        left = self.began + self.limit - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"past the run's deadline of {self.limit:.0f} s")
        return min(want, left)

    def sleep(self, seconds: float) -> None:
        if self.limit is not None and time.monotonic() + seconds > self.began + self.limit:
            raise TimeoutError(f"past the run's deadline of {self.limit:.0f} s")
        time.sleep(seconds)


def _ours(since: float, until: float, client: str | None = None) -> Callable[[Seen], bool]:
    def match(s: Seen) -> bool:
        return (s.access_key == SOURCE_KEY and since <= s.at <= until
                and (client is None or s.client == client))
    return match


def _call_figures(quota: QuotaProxy, shards: int, since: float, until: float) -> dict[str, Any]:
    """Peaks in 10-s windows and means per shard per second of the source's calls in the window."""
    seconds = until - since
    out: dict[str, Any] = {"seconds": round(seconds, 1)}
    for op, key in (("GetRecords", "get_records"), ("GetShardIterator", "get_shard_iterator")):
        out[f"{key}_peak"] = quota.peak_rate(op, WINDOW_S, where=_ours(since, until))
        out[f"{key}_peak_driver"] = quota.peak_rate(op, WINDOW_S, where=_ours(since, until, "async"))
        out[f"{key}_peak_executors"] = quota.peak_rate(op, WINDOW_S, where=_ours(since, until, "sync"))
        for who, client in (("driver", "async"), ("executors", "sync")):
            n = len(quota.calls(op, where=_ours(since, until, client)))
            out[f"{key}_mean_{who}"] = n / shards / seconds
    return out


def _idle_figures(quota: QuotaProxy, shards: int, since: float, until: float) -> dict[str, Any]:
    minutes = (until - since) / 60
    driver = len(quota.calls("GetRecords", where=_ours(since, until, "async")))
    executors = len(quota.calls("GetRecords", where=_ours(since, until, "sync")))
    return {
        "window_seconds": round(until - since, 1),
        "driver_get_records_per_shard_per_minute": driver / shards / minutes,
        "executor_get_records": executors,
        "get_shard_iterator": len(quota.calls("GetShardIterator", where=_ours(since, until))),
    }


def run_spark(
    spark: Any, url: str, shards: int, rate: float, measure_s: float, idle_s: float,
    idle_window_s: float, deadline_s: float | None = None, neighbour_threads: int = 1,
) -> dict[str, Any]:
    """One Spark run (see the module docstring); ``deadline_s`` bounds it."""
    clock = _Clock(deadline_s)
    kinesis = settings(url).boto3_client("kinesis")
    stream = create_stream(kinesis, shards, "quota")
    ids = _shard_ids(kinesis, stream)
    checkpoint = tempfile.mkdtemp(prefix="kddb-bench-")
    options = source_options(url, stream, checkpointTable="kinesis-ddb-bench-quota",
                             initialPosition="TRIM_HORIZON")
    out: dict[str, Any] = {"shards": shards, "records_per_shard_per_second": rate, "setting": "spark",
                           "measure_seconds": measure_s}
    quota = QuotaProxy(url)  # (its __enter__ is typed as the base class's)
    with quota, Feeders(kinesis, stream, ids, rate) as feed:
        options["endpointUrl"] = quota.url
        with Neighbour(quota.url, stream, ids, neighbour_threads) as neighbour:
            started = time.monotonic()
            query = _start(spark, options, checkpoint)
            try:
                _wait(lambda: _rows_read(query) > 0, clock.left(FIRST_BATCH_TIMEOUT_S),
                      "the first batch with records", query)
                since = time.monotonic()
                out["first_batch_seconds"] = round(since - started, 1)
                before = _batches(query)
                clock.sleep(measure_s)
                until = time.monotonic()
                batches = _batches(query) - before
                feed.__exit__(None, None, None)  # the idle phase: nothing more is written
                fed = feed.fed()
                idle_from = time.monotonic()
                _wait(lambda: _rows_read(query) >= fed, clock.left(CATCH_UP_TIMEOUT_S),
                      f"the {fed} records fed", query)
                out["caught_up_seconds"] = round(time.monotonic() - idle_from, 1)
                idle_from = time.monotonic()  # every record read: the shards are idle from here
                clock.sleep(max(0.0, idle_from + idle_s - time.monotonic()))
                idle_until = time.monotonic()
                read = _rows_read(query)
                progress = [json.loads(p.json) for p in query.recentProgress]
            finally:
                query.stop()
                shutil.rmtree(checkpoint, ignore_errors=True)
        ended = time.monotonic()
        out.update({
            "window": _call_figures(quota, shards, since, until),
            "batches_in_window": batches,
            "idle": {**_idle_figures(quota, shards, idle_until - idle_window_s, idle_until),
                     "idle_seconds": round(idle_until - idle_from, 1)},
            "refused_source": quota.refused(where=lambda s: s.access_key == SOURCE_KEY),
            "refused_neighbour": quota.refused(where=lambda s: s.access_key == NEIGHBOUR_KEY),
            "neighbour_calls": neighbour.calls,
            "neighbour_errors": sorted(set(neighbour.errors)),
            "neighbour_rounds_per_second": neighbour.rounds / neighbour.threads / (ended - started),
            "records_fed": fed,
            "records_read": read,
            "run_seconds": round(ended - started, 1),
            "trigger_ms_median": statistics.median(
                p["durationMs"].get("triggerExecution", 0) for p in progress if p["numInputRows"] > 0
            ) if progress else None,
        })
    return out


def run_planner(url: str, shards: int, rate: float, measure_s: float) -> dict[str, Any]:
    """The driver alone at ``shards`` shards: ``Planner`` driven as Spark drives it (each answer
    with new ends is planned and handed over at once, its executor reads booked but not made),
    the feeder on, the driver's calls counted on the proxy."""
    from kinesis_source.driver.planner import Planner, plan_ranges
    from kinesis_source.options import SourceOptions
    from kinesis_source.positions import Offset, Position, ShardId

    kinesis = settings(url).boto3_client("kinesis")
    stream = create_stream(kinesis, shards, "quota-planner")
    ids = _shard_ids(kinesis, stream)
    out: dict[str, Any] = {"shards": shards, "records_per_shard_per_second": rate, "setting": "planner",
                           "measure_seconds": measure_s}
    quota = QuotaProxy(url)
    with quota, Feeders(kinesis, stream, ids, rate):
        # No executors read here, so none report: the driver probes every shard itself.
        opts = SourceOptions.parse(source_options(quota.url, stream, dynamodbEndpointUrl=url, tipReports="false"))
        planner = Planner(opts)
        try:
            start = Offset({ShardId(stream, s): Position.trim_horizon() for s in ids})
            began = time.monotonic()
            start = planner.latest_offset(start)  # waits for every shard's first probe
            out["first_answer_seconds"] = round(time.monotonic() - began, 1)
            since = time.monotonic()
            answers = batches = ranges = 0
            while time.monotonic() < since + measure_s:
                end = planner.latest_offset(start)
                answers += 1
                if end != start:
                    todo = plan_ranges(start, end)
                    planner.hand_over(todo)
                    batches += 1
                    ranges += len(todo)
                    start = end
                time.sleep(0.01)  # Spark's polling delay between triggers without data
            until = time.monotonic()
            stats = planner.stats()
        finally:
            out["close"] = close_planner(planner, CLOSE_TIMEOUT_S)
    figures = _call_figures(quota, shards, since, until)
    out.update({
        "window": {k: v for k, v in figures.items() if "executors" not in k},
        "answers": answers,
        "batches": batches,
        "ranges_per_batch": ranges / batches if batches else 0,
        "refused_source": quota.refused(where=lambda s: s.access_key == SOURCE_KEY),
        "budget_wait_s": stats["budgetWaitS"],
        "background_probes": stats["backgroundProbes"],
    })
    return out


def _print(r: dict[str, Any]) -> None:
    w = r["window"]
    line = (
        f"  quota {r['setting']} {r['shards']:>5} shards @ {r['records_per_shard_per_second']}/s: "
        f"peak GetRecords {w['get_records_peak']:.2f}/s/shard, GetShardIterator "
        f"{w['get_shard_iterator_peak']:.2f}/s/shard (10 s windows); mean GetRecords driver "
        f"{w['get_records_mean_driver']:.2f} executors {w.get('get_records_mean_executors', 0):.2f}; "
        f"refused: source {r['refused_source']}"
    )
    if r["setting"] == "spark":
        line += (
            f", neighbour {r['refused_neighbour']} of {r['neighbour_calls']}; fed {r['records_fed']} "
            f"read {r['records_read']}; idle driver GetRecords "
            f"{r['idle']['driver_get_records_per_shard_per_minute']:.2f}/shard/min"
        )
    print(line, flush=True)


def run_suite(spark: Any, url: str, quick: bool, shard_counts: tuple[int, ...] | None = None) -> dict[str, Any]:
    """Every shard count (4 and 10; 4 with ``quick``), then 1,000 shards on full runs. On full
    runs the 4-shard query and its neighbour run side by side for ``NEIGHBOUR_S`` (the
    acceptance's five minutes)."""
    measure_s, idle_s, idle_window_s = (20.0, 25.0, 20.0) if quick else (60.0, 70.0, 60.0)
    counts = shard_counts or ((4,) if quick else (4, 10, BIG_SHARDS))
    runs = []
    for shards in counts:
        if shards < BIG_SHARDS:
            window = NEIGHBOUR_S if shards == 4 and not quick else measure_s
            r = run_spark(spark, url, shards, RATE, window, idle_s, idle_window_s)
            _print(r)
            runs.append(r)
            continue
        try:
            r = run_spark(spark, url, shards, BIG_RATE, measure_s, idle_s, idle_window_s,
                          deadline_s=BIG_DEADLINE_S, neighbour_threads=20)
        except (TimeoutError, RuntimeError) as exc:
            print(f"  quota spark {shards} shards: abandoned ({exc}); the driver alone instead", flush=True)
            r = run_planner(url, shards, BIG_RATE, measure_s)
            r["spark_abandoned"] = str(exc)
        _print(r)
        runs.append(r)
    return {"measure_seconds": measure_s, "idle_seconds": idle_s, "idle_window_seconds": idle_window_s,
            "window_seconds": WINDOW_S, "runs": runs}


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--shards", help="comma-separated shard counts (default: the suite's)")
    parser.add_argument("--planner", action="store_true", help="the driver alone (Planner), no Spark")
    args = parser.parse_args()
    local_env()
    from kinesis_source.tools.local import LocalEndpoint

    counts = tuple(int(s) for s in args.shards.split(",")) if args.shards else None
    with LocalEndpoint() as ep:
        if args.planner:
            for shards in counts or (BIG_SHARDS,):
                r = run_planner(ep.url, shards, BIG_RATE if shards >= BIG_SHARDS else RATE,
                                20.0 if args.quick else 60.0)
                _print(r)
                print(json.dumps(r, indent=1))
            return
        from benchmarks import spark_env

        spark = spark_env.session()
        try:
            print(json.dumps(run_suite(spark, ep.url, args.quick, counts), indent=1))
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
