"""Test-only wrappers of the kinesis-ddb source for the chaos suite (no hook in production code).

``format("kinesis-ddb-chaos")`` is :class:`~kinesis_source.source.KinesisDataSource` with a
reader that

- appends every phase it enters and leaves to ``$KDDB_CHAOS_DIR/<run>.phases`` (``planning`` =
  ``latestOffset``/``initialOffset``, ``partitions``, ``reading`` = ``read`` on an executor,
  ``committing`` = ``commit``), so a SIGKILL at a random time can be attributed to a phase;
- blocks forever at a phase when the file ``$KDDB_CHAOS_DIR/pause-<run>-<phase>`` exists (after
  writing ``<run>.paused``), so the caller can SIGKILL the driver exactly there: ``planning``
  (a new end was probed, Spark has not logged it), ``partitions`` (logged, not yet read),
  ``reading`` (an executor sent its first page), ``committing`` (``commit(end)`` wrote DynamoDB
  and has not returned);
- kills its own Python worker (SIGKILL) once, right after sending the first page of a range,
  when the file ``$KDDB_CHAOS_DIR/killworker-<run>`` exists (claimed by an atomic rename, so only
  one worker dies); each read attempt is logged to ``<run>.reads.jsonl``.

The run name comes from ``$KDDB_CHAOS_RUN``. Spark's helper and workers inherit both variables
from the driver process, and import this module by name (the repository root is on PYTHONPATH).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

from kinesis_source.options import SourceOptions
from kinesis_source.source import KinesisDataSource, KinesisStreamReader

CHAOS_FORMAT = "kinesis-ddb-chaos"

# Python logging in Spark's helper and worker processes (which configure none), e.g. INFO for
# the secrets test, which greps what the source logs.
if os.environ.get("KDDB_CHAOS_PY_LOG"):
    logging.basicConfig(level=os.environ["KDDB_CHAOS_PY_LOG"],
                        format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
PAUSE_PHASES = ("planning", "partitions", "reading", "committing")


def _dir() -> str | None:
    return os.environ.get("KDDB_CHAOS_DIR")


def _run() -> str:
    return os.environ.get("KDDB_CHAOS_RUN", "run")


def note(phase: str, event: str, extra: str = "") -> None:
    """Append ``<time> <pid> <phase> <event> <extra>`` to the run's phase log."""
    d = _dir()
    if not d:
        return
    line = f"{time.time():.3f} {os.getpid()} {phase} {event} {extra}".rstrip() + "\n"
    with open(os.path.join(d, f"{_run()}.phases"), "a") as fh:
        fh.write(line)


def pause_point(phase: str) -> None:
    """Block forever here if the caller asked for a pause at ``phase``."""
    d = _dir()
    if not d or not os.path.exists(os.path.join(d, f"pause-{_run()}-{phase}")):
        return
    note(phase, "paused")
    with open(os.path.join(d, f"{_run()}.paused"), "w") as fh:
        fh.write(phase)
    while True:  # the caller SIGKILLs the process group
        time.sleep(3600)


def _claim_worker_kill() -> bool:
    d = _dir()
    if not d:
        return False
    try:
        os.rename(os.path.join(d, f"killworker-{_run()}"), os.path.join(d, f"killworker-{_run()}.claimed"))
    except FileNotFoundError:
        return False
    return True


def _ranges(partition: Any) -> str:
    return ";".join(str(r).replace(" ", "") for r in partition.ranges)


def _log_read(partition: Any, **fields: Any) -> None:
    d = _dir()
    if not d:
        return
    from pyspark import TaskContext

    ctx = TaskContext.get()
    lines = []
    for rng in partition.ranges:  # a task reads one or more shards
        entry = {
            "pid": os.getpid(),
            "stream": rng.stream,
            "shard": rng.shard_id,
            "start": rng.start.to_str(),
            "end_seq": rng.end_seq,
            "attempt": ctx.attemptNumber() if ctx else None,
            "stage": ctx.stageId() if ctx else None,
            "partition": ctx.partitionId() if ctx else None,
            **fields,
        }
        lines.append(json.dumps(entry) + "\n")
    with open(os.path.join(d, f"{_run()}.reads.jsonl"), "a") as fh:
        fh.write("".join(lines))


class ChaosReader(KinesisStreamReader):
    """The production reader with phase notes, pause points and the one-off worker kill."""

    def initialOffset(self) -> dict:
        note("planning", "enter", "initialOffset")
        try:
            return super().initialOffset()
        finally:
            note("planning", "exit", "initialOffset")

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        note("planning", "enter")
        end = super().latestOffset(start, limit)
        if start is not None and end != start:
            pause_point("planning")
        note("planning", "exit")
        return end

    def partitions(self, start: dict, end: dict) -> list:
        note("partitions", "enter")
        parts = super().partitions(start, end)
        pause_point("partitions")
        note("partitions", "exit")
        return parts

    def read(self, partition: Any) -> Iterator[Any]:
        note("reading", "enter", _ranges(partition))
        kill = _claim_worker_kill()
        _log_read(partition, kill=kill)
        first = True
        for batch in super().read(partition):
            yield batch
            if first:
                first = False
                pause_point("reading")
                if kill:
                    note("reading", "worker-killed", _ranges(partition))
                    os.kill(os.getpid(), signal.SIGKILL)
        note("reading", "exit")

    def commit(self, end: dict) -> None:
        note("committing", "enter")
        super().commit(end)
        pause_point("committing")
        note("committing", "exit")


class ChaosDataSource(KinesisDataSource):
    """``format("kinesis-ddb-chaos")``: the production source with :class:`ChaosReader`."""

    @classmethod
    def name(cls) -> str:
        return CHAOS_FORMAT

    def streamReader(self, schema: Any) -> ChaosReader:
        return ChaosReader(SourceOptions.parse(dict(self.options)), type(self).commit_callback)


def register_chaos(spark: Any) -> None:
    """Register ``format("kinesis-ddb-chaos")``."""
    spark.dataSource.register(ChaosDataSource)
