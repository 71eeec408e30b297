"""Helpers shared by the benchmarks: summaries of repeated runs, the machine's description, local
AWS clients and filling streams with a backlog.

Every figure is a median over repeated runs with its spread (max - min), measured in one run on
one machine, so that ratios between a baseline and kinesis-ddb are what counts.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kinesis_source.aws.clients import AwsSettings
from kinesis_source.tools.local import LOCAL_CREDENTIALS

REGION = "us-east-1"
# Records of a put_records call: Kinesis' (and moto's) limit.
PUT_BATCH = 500


def p95(s: dict[str, Any]) -> float:
    """The 95th percentile of a :func:`summary`'s values."""
    vals = sorted(s["values"])
    return vals[int(0.95 * (len(vals) - 1))]


def summary(values: Iterable[float]) -> dict[str, Any]:
    """Median, min, max and spread (max - min) of repeated measurements, with the values."""
    vals = [float(v) for v in values]
    return {
        "median": statistics.median(vals),
        "min": min(vals),
        "max": max(vals),
        "spread": max(vals) - min(vals),
        "n": len(vals),
        "values": vals,
    }


def timed(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> list[float]:
    """Wall seconds of ``fn()`` over ``repeats`` runs, after ``warmup`` runs not counted."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def describe(s: dict[str, Any], unit: str = "", digits: int = 0) -> str:
    """``median (spread x)`` of a summary, for printing."""
    return f"{s['median']:,.{digits}f}{unit} (spread {s['spread']:,.{digits}f})"


def local_env() -> None:
    """Environment for local endpoints and Spark's Python processes (this interpreter, loopback,
    the repository on the path so the helper can import ``benchmarks.naive``)."""
    os.environ.update(LOCAL_CREDENTIALS)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])


def settings(url: str) -> AwsSettings:
    """The source's own client settings for a local endpoint."""
    return AwsSettings(
        region=REGION, endpoint_url=url, access_key_id="local", secret_key="local"
    )


def source_options(url: str, stream: str, **extra: str) -> dict[str, str]:
    """Options of a kinesis-ddb query on the local endpoint (a fresh application name)."""
    return {
        "streamName": stream,
        "endpointUrl": url,
        "dynamodbEndpointUrl": url,
        "region": REGION,
        "awsAccessKeyId": "local",
        "awsSecretKey": "local",
        "applicationName": f"bench-{uuid.uuid4().hex[:10]}",
        "initialPosition": "TRIM_HORIZON",
        "tipReportHost": "127.0.0.1",
        **extra,
    }


def create_stream(client: Any, shards: int, prefix: str = "bench") -> str:
    """A new stream of ``shards`` shards, ACTIVE."""
    name = f"{prefix}-{shards}-{uuid.uuid4().hex[:8]}"
    client.create_stream(StreamName=name, ShardCount=shards)
    client.get_waiter("stream_exists").wait(
        StreamName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 150}
    )
    return name


def shard_hash_keys(client: Any, stream: str) -> list[tuple[str, str]]:
    """(shard id, starting hash key) of every shard, so puts can target each shard evenly."""
    shards, kwargs = [], {"StreamName": stream}
    while True:
        resp = client.list_shards(**kwargs)
        shards += [(s["ShardId"], s["HashKeyRange"]["StartingHashKey"]) for s in resp["Shards"]]
        if not resp.get("NextToken"):
            return shards
        kwargs = {"NextToken": resp["NextToken"]}


def put_rounds(
    client: Any, stream: str, rounds: int, size: int, hash_keys: list[tuple[str, str]]
) -> dict[str, str]:
    """Put ``rounds`` rounds of one ``size``-byte record per shard (a steady producer, every
    shard alike, each round in its own calls); returns the last sequence number put in each
    shard."""
    payload = os.urandom(size)
    last: dict[str, str] = {}
    batch: list[dict[str, Any]] = []

    def flush() -> None:
        resp = client.put_records(StreamName=stream, Records=batch)
        assert resp.get("FailedRecordCount", 0) == 0, resp
        for res in resp["Records"]:
            last[res["ShardId"]] = res["SequenceNumber"]
        batch.clear()

    for r in range(rounds):
        for i, (_, hash_key) in enumerate(hash_keys):
            batch.append({"Data": payload, "PartitionKey": f"k{i}-{r}", "ExplicitHashKey": hash_key})
            if len(batch) == PUT_BATCH:
                flush()
        if batch:  # a round is its own call(s): rounds arrive one after another, as produced
            flush()
    return last


def fill_backlog(client: Any, stream: str, records: int, size: int) -> dict[str, int]:
    """Put ``records`` records of ``size`` bytes spread evenly over the shards; returns the
    count per shard."""
    keys = shard_hash_keys(client, stream)
    per_shard = {shard: 0 for shard, _ in keys}
    payload = os.urandom(size)
    for start in range(0, records, PUT_BATCH):
        batch = [
            {"Data": payload, "PartitionKey": f"k{i}", "ExplicitHashKey": keys[i % len(keys)][1]}
            for i in range(start, min(records, start + PUT_BATCH))
        ]
        resp = client.put_records(StreamName=stream, Records=batch)
        assert resp.get("FailedRecordCount", 0) == 0, resp
        for res in resp["Records"]:
            per_shard[res["ShardId"]] += 1
    return per_shard


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc's CPU ticks a second


def server_cpu_seconds(marker: str = "moto.server") -> float:
    """CPU seconds (user and system) used so far by the local processes whose command line holds
    ``marker`` (Linux ``/proc``; 0.0 elsewhere): what the test servers take from the machine
    that Spark and the source share."""
    return sum(p.ticks for p in proc_stats() if marker.encode() in p.cmd) / _TICK


@dataclass(frozen=True)
class ProcStat:
    """What ``/proc/<pid>`` says of a process: its parent, command line and CPU ticks."""

    pid: int
    ppid: int
    cmd: bytes  # the command line, arguments separated by NUL
    ticks: int  # CPU ticks of its own so far: user and system
    reaped_ticks: int  # CPU ticks of the children it waited for: user and system

    @property
    def program(self) -> str:
        """The base name of the program it runs (``java``, ``python3``...)."""
        return os.path.basename(self.cmd.split(b"\0")[0].decode(errors="replace"))


def proc_stat(pid: int) -> ProcStat | None:
    """``pid``'s :class:`ProcStat` (None: gone, or no ``/proc``)."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # after the name: state, ppid, ... utime (12th), stime, cutime, cstime
    return ProcStat(pid, int(fields[1]), cmd, int(fields[11]) + int(fields[12]),
                    int(fields[13]) + int(fields[14]))


def proc_stats() -> Iterator[ProcStat]:
    """:class:`ProcStat` of every process readable in ``/proc`` (none elsewhere)."""
    for proc in Path("/proc").glob("[0-9]*"):
        found = proc_stat(int(proc.name))
        if found is not None:  # (else gone meanwhile)
            yield found


def machine_cpu() -> tuple[float, float] | None:
    """(busy, total) CPU ticks of the whole machine so far, every core (Linux ``/proc/stat``;
    None elsewhere): two readings give how busy the machine was between them."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
    total = sum(fields[:8])  # guest time is already counted in user
    return float(total - idle), float(total)


def _process_ticks() -> dict[tuple[int, str], tuple[float, float]]:
    """CPU ticks (user and system) of every Python and Java process so far, with when each was
    read (monotonic: a scan of ``/proc`` from a busy Python process can take a good part of a
    second, so one time for the whole scan would be wrong for most of it), by (pid, what it is:
    ``benchmark`` for this one, ``moto``, ``spark-python`` for PySpark's daemon and workers,
    ``java``, else ``python``); empty where ``/proc`` is missing."""
    out: dict[tuple[int, str], tuple[float, float]] = {}
    me = os.getpid()
    for p in proc_stats():
        read_at = time.monotonic()
        cmd = p.cmd
        if b"python" not in cmd and b"java" not in cmd:
            continue
        # (Spark's JVM names pyspark-shell on its command line: the program decides first)
        what = ("benchmark" if p.pid == me else "java" if p.program == "java" else "moto" if b"moto.server" in cmd
                else "spark-python" if b"pyspark" in cmd else "python")
        out[(p.pid, what)] = (read_at, float(p.ticks))
    return out


class CpuSampler:
    """Samples :func:`machine_cpu` every ``interval_s`` on a thread, and each Python and Java
    process's CPU (:func:`_process_ticks`), so that how busy the machine and its busiest process
    were over any window of the run can be read afterwards (:meth:`busy`, :meth:`busiest`)."""

    def __init__(self, interval_s: float = 0.25) -> None:
        self.samples: list[tuple[float, float, float]] = []  # (monotonic, busy, total)
        self.processes: list[tuple[float, dict[tuple[int, str], tuple[float, float]]]] = []
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def _run(self) -> None:
        while True:
            reading = machine_cpu()
            if reading is not None:
                self.samples.append((time.monotonic(), *reading))
            self.processes.append((time.monotonic(), _process_ticks()))
            if self._stop.wait(self._interval):
                return

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _around(self, rows: list, start: float, end: float) -> list:
        return [r for r in rows if start - self._interval <= r[0] <= end + self._interval]

    def busy(self, start: float, end: float) -> float | None:
        """The share of the machine's CPU (every core) in use from ``start`` to ``end``
        (monotonic), between the samples nearest them; None without two samples there."""
        inside = self._around(self.samples, start, end)
        if len(inside) < 2 or inside[-1][2] <= inside[0][2]:
            return None
        return (inside[-1][1] - inside[0][1]) / (inside[-1][2] - inside[0][2])

    def peak_busy(self, start: float, end: float, span_s: float = 1.0) -> float | None:
        """The most of the machine's CPU in use over any ``span_s`` from ``start`` to ``end``
        (a window's mean hides a saturated burst, such as every shard's first pages at once)."""
        inside = self._around(self.samples, start, end)
        peaks = []
        for i, (t0, busy0, total0) in enumerate(inside):
            later = [s for s in inside[i + 1:] if s[0] - t0 >= span_s]
            if later and later[0][2] > total0:
                peaks.append((later[0][1] - busy0) / (later[0][2] - total0))
        return max(peaks) if peaks else None

    def cores_by_kind(self, start: float, end: float) -> dict[str, float]:
        """Cores each kind of process (``java``, ``spark-python``, ``moto``, ``benchmark``,
        ``python``) used on average from ``start`` to ``end`` (monotonic), between the samples
        nearest them; empty without two samples there."""
        inside = self._around(self.processes, start, end)
        if len(inside) < 2:
            return {}
        (_, first), (_, last) = inside[0], inside[-1]
        out: dict[str, float] = {}
        for key, (at, ticks) in last.items():
            before = first.get(key)
            # a process started inside the window counts from its start (0 ticks then)
            t0, ticks0 = before if before is not None else (inside[0][0], 0.0)
            if at > t0:
                out[key[1]] = out.get(key[1], 0.0) + (ticks - ticks0) / _TICK / (at - t0)
        return out

    def busiest(self, start: float, end: float) -> tuple[str, float] | None:
        """The process that used the most CPU from ``start`` to ``end`` (monotonic): what it is
        and how many cores it used on average (a Python process's one thread at a time holds
        at most one); None without two samples there."""
        inside = self._around(self.processes, start, end)
        if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
            return None
        (_, first), (_, last) = inside[0], inside[-1]
        used = {key: (ticks - first[key][1]) / _TICK / (at - first[key][0])
                for key, (at, ticks) in last.items() if key in first and at > first[key][0]}
        if not used:
            return None
        key = max(used, key=lambda k: used[k])
        return key[1], used[key]


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _java() -> str | None:
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
        return out.stderr.splitlines()[0] if out.stderr else None
    except (OSError, subprocess.SubprocessError):
        return None


def machine() -> dict[str, Any]:
    """What produced the figures: cores, memory, Python, Java and library versions."""
    mem_kb = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_kb = int(line.split()[1])
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "java": _java(),
        "libraries": {
            d: _version(d)
            for d in ("pyspark", "boto3", "botocore", "aiobotocore", "pyarrow", "moto", "aws-kinesis-agg")
        },
    }


def close_planner(planner: Any, timeout_s: float = 60.0) -> dict[str, Any]:
    """``planner.close()`` in a thread, within ``timeout_s``: how long it took, and whether it
    returned (a benchmark must not hang on a planner that does not stop)."""
    import threading

    began = time.monotonic()
    worker = threading.Thread(target=planner.close, daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        print(f"  Planner.close() did not return within {timeout_s:.0f} s", flush=True)
    return {"seconds": round(time.monotonic() - began, 2), "closed": not worker.is_alive()}
