"""Planning: what ``latestOffset`` costs on the driver for 10, 100 and 1,000 shards (moto server),
now that it answers from the tip table, and what keeping the table fresh costs.

``kinesis_source.driver.planner.Planner`` runs with the default options (endpoints and
credentials aside). After its first answer (which waits for every shard's first probe) it is in
steady state: ``latest_offset`` answers from the tip table while a background task probes the
shards. For each shard count:

- **idle**: ``latest_offset(start)`` timed ``CALLS`` times (wall and CPU of the calling thread)
  while no record arrives, and the AWS calls the answers made themselves (counted with a
  ``ContextVar`` set around the timed calls: the background task's calls do not carry it);
- **new data**: ``rounds`` records per shard are put (1 KB, one round after another), then
  ``latest_offset`` is polled until every shard's end is the last record put (the table has
  seen them; deadline ``REFRESH_TIMEOUT_S``), and timed ``CALLS`` times with those ends;
- **background refresh**: the time from the end of the put to the table having every shard's
  new tip, after an idle spell (shards backed off towards ``maxIdleProbeIntervalMs``) and while
  the shards are active (one more round right after the table found the last); the planner's
  event-loop thread's CPU per background probe, and the driver's calls, records and response
  bytes while it found the new records; the batch's bytes (``RangeReader`` over its ranges,
  from scratch), and what executors read as the planner hands the ranges over (the records
  the probes read and it carries, its iterators). What was read twice is the driver's bytes
  and the executors', less the batch's.

A second case, ``sustained``, is a batch of many records per shard (10 shards): the bytes it
read twice against its bytes.

With ``--latency-ms N`` the planner (alone) talks to Kinesis through the quota-enforcing
proxy with ``N`` ms injected in every request (the stream is made and fed behind it); its
refusals of the planner's calls are printed.

    python -m benchmarks.planning [--quick] [--shards 10,100] [--latency-ms 20]
"""

from __future__ import annotations

import argparse
import contextvars
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks.common import (
    close_planner,
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
CALLS = 30  # timed latest_offset calls per case
CALL_GAP_S = 0.02  # between timed calls (Spark's polling delay is 10 ms)
REFRESH_TIMEOUT_S = 120.0
POLL_S = 0.1  # polling for the refresh after an idle spell (its precision)
SETTLE_S = 3.0  # after the first answer, before the idle calls are timed
FEED_INTERVAL_S = 0.5  # a steady feed's rounds
FEED_WARMUP_S = 3.0  # the shards leave their idle backoff
FEED_QUIET_S = 10.0  # the background's cost measured, nothing else on the loop
FEED_POLL_S = 10.0  # answers polled, each round's freshness measured
LOOP_THREAD = "kinesis-ddb-planner"

# Set around the timed latest_offset calls: the coroutine Planner runs for a call inherits the
# calling thread's context, the background task (started by the warm-up call) does not.
_TIMED: contextvars.ContextVar[bool] = contextvars.ContextVar("timed", default=False)


class ByteMeter:
    """Counts response bytes and calls of botocore/aiobotocore clients (``after-call`` hook);
    ``own_calls``: the calls made while :data:`_TIMED` is set (the timed answers' own)."""

    def __init__(self) -> None:
        self.bytes = 0
        self.calls = 0
        self.own_calls = 0

    def attach(self, client: Any) -> None:
        """Count every call ``client`` makes from now on."""
        client.meta.events.register("after-call.kinesis.*", self._seen)

    def _seen(self, http_response: Any, **_: Any) -> None:
        # aiobotocore's response keeps the body read in ``_content``; botocore's too.
        body = getattr(http_response, "_content", None)
        self.bytes += len(body) if body is not None else int(http_response.headers.get("content-length", 0))
        self.calls += 1
        if _TIMED.get():
            self.own_calls += 1


def _loop_cpu() -> float:
    """CPU seconds of the planner's event-loop thread (background probes and the answers'
    coroutines), 0 when it is not running."""
    for t in threading.enumerate():
        if t.name == LOOP_THREAD and t.ident is not None:
            return time.clock_gettime(time.pthread_getcpuclockid(t.ident))
    return 0.0


def _planner(url: str, stream: str) -> tuple[Planner, ByteMeter]:
    planner = Planner(SourceOptions.parse(source_options(url, stream)))  # default options
    meter = ByteMeter()
    meter.attach(planner.kinesis().client)  # made now, so the meter sees every call
    return planner, meter


def _batch_bytes(url: str, planner: Planner, start: Offset, end: Offset) -> tuple[int, int, int]:
    """(records, response bytes, executors' response bytes) of the batch ``start``..``end``:
    the bytes of reading its ranges from scratch (each record once), and what executors read
    of them as the planner hands them over (the records it carries, its iterators)."""
    ranges = plan_ranges(start, end)
    booked, _ = planner.hand_over(ranges)

    def read_all(handed: bool) -> tuple[int, int]:
        client = settings(url).boto3_client("kinesis")
        meter = ByteMeter()
        meter.attach(client)

        def read(rng: Any) -> int:
            opener, carried = (booked[rng.shard][0], booked[rng.shard][5]) if handed else (None, ())
            reader = RangeReader(client, rng, 10000, opener=opener, carried=carried)
            return sum(len(page) for page in reader.pages())

        with ThreadPoolExecutor(8) as pool:
            return sum(pool.map(read, ranges)), meter.bytes

    _, executors = read_all(handed=True)  # (first: the hand-over's iterators are fresh)
    records, batch = read_all(handed=False)
    # Spark's next latestOffset ends the batch: the shards handed to executor reads are probed
    # again (until then the table waits for their reports, which these reads do not send)
    planner.latest_offset(end)
    return records, batch, executors


class _Snapshot:
    """The driver's counters at one moment."""

    def __init__(self, planner: Planner, meter: ByteMeter) -> None:
        stats = planner.stats()
        self.at = time.perf_counter()
        self.calls, self.bytes, self.own = meter.calls, meter.bytes, meter.own_calls
        self.probes = stats["backgroundProbes"]
        self.records = stats["driverRecordsFetched"]
        self.cpu = _loop_cpu()

    def since(self, other: _Snapshot) -> dict[str, float]:
        return {
            "seconds": self.at - other.at,
            "calls": self.calls - other.calls,
            "own_calls": self.own - other.own,
            "bytes": self.bytes - other.bytes,
            "probes": self.probes - other.probes,
            "records": self.records - other.records,
            "loop_cpu_seconds": self.cpu - other.cpu,
        }


def _timed_calls(planner: Planner, meter: ByteMeter, start: Offset, expect: Offset) -> dict[str, Any]:
    """``CALLS`` timed answers (each must be ``expect``): wall and calling-thread CPU per call,
    the answers' own AWS calls and the background's calls meanwhile."""
    walls, cpus = [], []
    before = _Snapshot(planner, meter)
    for _ in range(CALLS):
        token = _TIMED.set(True)
        try:
            wall, cpu = time.perf_counter(), time.thread_time()
            end = planner.latest_offset(start)
            cpus.append(time.thread_time() - cpu)
            walls.append(time.perf_counter() - wall)
        finally:
            _TIMED.reset(token)
        assert end == expect, "the table's answer changed while it was timed"
        time.sleep(CALL_GAP_S)
    spent = _Snapshot(planner, meter).since(before)
    return {
        "seconds": summary(walls),
        "caller_cpu_seconds": summary(cpus),
        "own_calls": spent["own_calls"],
        "background_calls": spent["calls"] - spent["own_calls"],
        "background_probes": spent["probes"],
        "calls_timed": CALLS,
    }


def _until_seen(planner: Planner, start: Offset, expect: Offset) -> float:
    """Poll ``latest_offset(start)`` (every ``POLL_S``) until it answers ``expect``; the time
    that took."""
    began = time.perf_counter()
    while planner.latest_offset(start) != expect:
        if time.perf_counter() - began > REFRESH_TIMEOUT_S:
            raise TimeoutError(f"the tip table did not see the new records in {REFRESH_TIMEOUT_S:.0f} s")
        time.sleep(POLL_S)
    return time.perf_counter() - began


def _ends(stream: str, last: dict[str, str]) -> Offset:
    return Offset({ShardId(stream, s): Position.after(seq) for s, seq in last.items()})


class _SteadyFeed:
    """One round (a record per shard) every ``FEED_INTERVAL_S`` in a thread; ``rounds`` holds
    each round's end time and last sequence number per shard."""

    def __init__(self, kinesis: Any, stream: str, keys: list[tuple[str, str]]) -> None:
        self._args = (kinesis, stream, 1, RECORD_BYTES, keys)
        self.rounds: list[tuple[float, dict[str, str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        began, n = time.perf_counter(), 0
        while not self._stop.is_set():
            last = put_rounds(*self._args)
            self.rounds.append((time.perf_counter(), last))
            n += 1
            # pacing to the feed's rate, not waiting for a condition
            self._stop.wait(max(0.0, began + n * FEED_INTERVAL_S - time.perf_counter()))

    def __enter__(self) -> _SteadyFeed:
        self._thread.start()
        return self

    def stop(self) -> None:
        """No more rounds (the one being put completes)."""
        self._stop.set()
        self._thread.join(timeout=60)

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _freshness(planner: Planner, start: Offset, feed: _SteadyFeed, seconds: float) -> list[float]:
    """Poll ``latest_offset(start)`` for ``seconds`` while ``feed`` writes, then stop the feed
    and poll until the rounds put are all seen: for each round put meanwhile, the time from the
    end of its put to the first answer holding it on every shard."""
    first = len(feed.rounds)
    seen: dict[int, float] = {}
    until = time.perf_counter() + seconds
    while True:
        if time.perf_counter() >= until:
            feed.stop()  # no more rounds
            if len(seen) == len(feed.rounds) - first or time.perf_counter() > until + REFRESH_TIMEOUT_S:
                break
        end = planner.latest_offset(start)
        now = time.perf_counter()
        tips = {sid.shard: int(pos.seq) for sid, pos in end.shards.items() if pos.seq is not None}
        for i in range(first, len(feed.rounds)):
            if i not in seen and all(tips.get(sh, -1) >= int(q) for sh, q in feed.rounds[i][1].items()):
                seen[i] = now
        time.sleep(0.01)  # Spark's polling delay
    return [seen[i] - feed.rounds[i][0] for i in sorted(seen)]


def measure(url: str, shards: int, rounds: int, idle_s: float, planner_url: str | None = None) -> dict[str, Any]:
    """One stream of ``shards`` shards: idle and new-data answers, the refresh (see the module
    docstring); the planner talks to ``planner_url`` (default ``url``)."""
    kinesis = shared_client(settings(url), "kinesis")
    stream = create_stream(kinesis, shards, "plan")
    keys = shard_hash_keys(kinesis, stream)
    start = _ends(stream, put_rounds(kinesis, stream, 1, RECORD_BYTES, keys))
    planner, meter = _planner(planner_url or url, stream)
    out: dict[str, Any] = {"shards": shards, "rounds": rounds, "record_bytes": RECORD_BYTES}
    t0 = time.perf_counter()

    def phase(what: str) -> None:
        print(f"    [{time.perf_counter() - t0:6.1f} s] {shards} shards: {what}", flush=True)

    try:
        began = time.perf_counter()
        assert planner.latest_offset(start) == start  # the first answer waits for the first probes
        out["first_answer_seconds"] = time.perf_counter() - began
        time.sleep(SETTLE_S)
        out["idle"] = _timed_calls(planner, meter, start, start)
        phase("idle answers timed; idle spell")
        # An idle spell: the shards back off towards maxIdleProbeIntervalMs; nothing else runs
        # on the loop, so its CPU is the background's.
        quiet = _Snapshot(planner, meter)
        time.sleep(max(0.0, idle_s - SETTLE_S))
        spell = _Snapshot(planner, meter).since(quiet)
        out["idle_spell"] = {
            **spell,
            "probes_per_shard_per_minute": spell["probes"] / shards / (spell["seconds"] / 60),
            "loop_cpu_per_probe_seconds": spell["loop_cpu_seconds"] / max(1, spell["probes"]),
        }

        # New data after the idle spell: how long until the table has every shard's tip.
        phase(f"putting {rounds} rounds")
        before = _Snapshot(planner, meter)
        last = put_rounds(kinesis, stream, rounds, RECORD_BYTES, keys)
        put_done = _Snapshot(planner, meter)
        phase("put; waiting for the table")
        end = _ends(stream, last)
        refresh_idle = _until_seen(planner, start, end)
        seen = _Snapshot(planner, meter).since(before)
        new = _timed_calls(planner, meter, start, end)
        phase("new-data answers timed; reading the batch")
        new["put_seconds"] = put_done.at - before.at
        new["refresh_after_idle_seconds"] = refresh_idle
        new["refresh"] = seen
        new["batch_records"], new["batch_bytes"], new["executor_bytes"] = _batch_bytes(url, planner, start, end)
        assert new["batch_records"] == rounds * shards, new["batch_records"]
        # what was read twice: the probes' bytes and the executors', past the batch's own
        new["probe_pct_of_batch"] = 100.0 * (seen["bytes"] + new["executor_bytes"] - new["batch_bytes"]) / new[
            "batch_bytes"]
        new["driver_pct_of_batch"] = 100.0 * seen["bytes"] / new["batch_bytes"]
        out["new_data"] = new

        # A steady feed (a round every FEED_INTERVAL_S): the background's cost while nothing
        # else runs on the loop, then how fresh the answers are.
        phase("steady feed")
        with _SteadyFeed(kinesis, stream, keys) as feed:
            time.sleep(FEED_WARMUP_S)
            active = _Snapshot(planner, meter)
            time.sleep(FEED_QUIET_S)
            spent = _Snapshot(planner, meter).since(active)
            phase("steady feed: freshness")
            lags = _freshness(planner, end, feed, FEED_POLL_S)
        out["steady_feed"] = {
            **spent,
            "rounds_per_second": len(feed.rounds) / (feed.rounds[-1][0] - before.at) if feed.rounds else 0.0,
            "calls_per_shard_per_second": spent["calls"] / shards / spent["seconds"],
            "loop_cpu_per_probe_seconds": spent["loop_cpu_seconds"] / max(1, spent["probes"]),
            "freshness_seconds": summary(lags) if lags else None,
        }
        phase("done")
    finally:
        out["close"] = close_planner(planner)
    return out


def run_suite(
    url: str, quick: bool, shard_counts: tuple[int, ...] = SHARD_COUNTS, planner_url: str | None = None
) -> dict[str, Any]:
    """Every shard count and the sustained case, printed as it goes."""
    rounds, sustained_rounds, idle_s = (5, 100, 15.0) if quick else (20, 500, 30.0)
    cases = []
    for shards in shard_counts:
        r = measure(url, shards, rounds, idle_s, planner_url)
        _print(r)
        cases.append(r)
    sustained = measure(url, 10, sustained_rounds, idle_s, planner_url)
    _print(sustained, "sustained ")
    out: dict[str, Any] = {"version": 2, "calls_timed": CALLS, "cases": cases, "sustained": sustained}
    by = {c["shards"]: c for c in cases}
    if 10 in by and 1000 in by:
        for key, case in (("new_data", "new_data"), ("idle", "idle")):
            out[f"ratio_1000_over_10_{key}"] = (
                by[1000][case]["seconds"]["median"] / by[10][case]["seconds"]["median"])
    return out


def _print(r: dict[str, Any], label: str = "") -> None:
    n, i, f = r["new_data"], r["idle"], r["steady_feed"]
    fresh = f["freshness_seconds"]
    print(
        f"  planning {label}{r['shards']:>5} shards: first answer {r['first_answer_seconds']:.2f} s; "
        f"idle {describe(i['seconds'], ' s', 4)} {i['own_calls']:.0f} own calls; new data "
        f"{describe(n['seconds'], ' s', 4)} {n['own_calls']:.0f} own calls; refresh after idle "
        f"{n['refresh_after_idle_seconds']:.2f} s; steady feed: fresh after "
        + (describe(fresh, ' s', 2) + f" max {fresh['max']:.2f} s" if fresh else "-")
        + f", {f['calls_per_shard_per_second']:.2f} calls/shard/s, loop CPU/probe "
        f"{f['loop_cpu_per_probe_seconds'] * 1000:.1f} ms (idle probe "
        f"{r['idle_spell']['loop_cpu_per_probe_seconds'] * 1000:.1f} ms); probe bytes "
        f"{n['refresh']['bytes']:,.0f} B = {n['probe_pct_of_batch']:.1f}% of batch "
        f"{n['batch_bytes']:,.0f} B",
        flush=True,
    )


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--shards", help="comma-separated shard counts (default 10,100,1000)")
    parser.add_argument("--latency-ms", type=float, help="the planner behind the quota proxy, this much per request")
    args = parser.parse_args()
    local_env()
    counts = tuple(int(s) for s in args.shards.split(",")) if args.shards else SHARD_COUNTS
    with LocalEndpoint() as ep:
        if args.latency_ms is None:
            run_suite(ep.url, args.quick, counts)
            return
        from tests.support.quota import QuotaProxy

        with QuotaProxy(ep.url) as quota:
            quota.latency = args.latency_ms / 1000
            run_suite(ep.url, args.quick, counts, planner_url=quota.url)
            print(f"  quota proxy ({args.latency_ms:g} ms per request): {len(quota.calls())} planner calls, "
                  f"{quota.refused()} refused", flush=True)


if __name__ == "__main__":
    main()
