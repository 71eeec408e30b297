"""CPU seconds of the client side of a Spark run, counted from ``/proc`` (issue 51).

The client is what a user pays for: Spark's JVM (driver and, in ``local[n]``, the executors),
every process it started (the Python data source's planning helper, PySpark's daemon and its
workers) and the driver's own Python thread that drives the query. The servers of a benchmark
(moto, the canned server, the quota proxy's threads in this process) are not counted.

A process tree's CPU is read as each process's own CPU plus its reaped children's
(``utime + stime + cutime + cstime``), so a worker that exits between two readings is still
counted: its parent, also in the tree, took its time when it reaped it. The difference of two
readings (:meth:`ClientCpu.reading`) is the tree's CPU between them.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from benchmarks.common import _TICK, proc_stats  # _TICK: /proc's CPU ticks a second


def tree_cpu(root: int) -> dict[int, tuple[str, float]]:
    """Every process under ``root`` (itself included): program and CPU seconds so far."""
    stats = {found.pid: found for found in proc_stats()}
    kids: dict[int, list[int]] = {}
    for found in stats.values():
        kids.setdefault(found.ppid, []).append(found.pid)
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            found = stats[pid]
            out[pid] = (found.program, (found.ticks + found.reaped_ticks) / _TICK)
            todo += kids.get(pid, [])
    return out


def spark_jvm_pid() -> int | None:
    """The pid of the JVM PySpark started for this process (a child whose program is java)."""
    me = os.getpid()
    return next((f.pid for f in proc_stats() if f.ppid == me and f.program == "java"), None)


@dataclass(frozen=True)
class CpuUse:
    """Client CPU seconds over a window, by part."""

    jvm: float  # the JVM's own threads
    python: float  # the JVM's Python children: the planning helper, PySpark's daemon and workers
    driver_thread: float  # this process's thread that drove the query (py4j calls)
    wall: float

    @property
    def total(self) -> float:
        """Every client part together."""
        return self.jvm + self.python + self.driver_thread


class ClientCpu:
    """Readings of the client's CPU; :meth:`window` measures a block of code."""

    def __init__(self) -> None:
        pid = spark_jvm_pid()
        if pid is None:
            raise RuntimeError("no Spark JVM child of this process: start the SparkSession first")
        self.jvm_pid = pid

    def reading(self) -> tuple[float, float, float, float]:
        """(JVM, its Python descendants, this thread, monotonic now)."""
        tree = tree_cpu(self.jvm_pid)
        jvm = tree.pop(self.jvm_pid, ("java", 0.0))[1]
        # The JVM's cutime holds the descendants it reaped; its live children's CPU is apart.
        return jvm, sum(cpu for _, cpu in tree.values()), time.thread_time(), time.monotonic()

    @contextmanager
    def window(self) -> Iterator[list[CpuUse]]:
        """Measure the block: the list yielded holds its :class:`CpuUse` afterwards. Must run
        in the thread that drives the query (its thread CPU is counted)."""
        assert threading.current_thread() is threading.main_thread()
        out: list[CpuUse] = []
        before = self.reading()
        yield out
        after = self.reading()
        # A Python child reaped by the JVM moves from "python" into the JVM's cutime: the two
        # parts' sum is exact, each part alone may shift by what was reaped in the window.
        out.append(CpuUse(after[0] - before[0], after[1] - before[1], after[2] - before[2],
                          after[3] - before[3]))
