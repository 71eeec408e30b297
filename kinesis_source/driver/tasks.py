"""How a batch's shard ranges become Spark tasks.

A Python task costs Spark tens of milliseconds whatever it reads, so a batch over 1,000 shards
must not be 1,000 tasks: shards are grouped, each shard whole in one task (its records stay in
order), the groups as even as the count allows. A task reads many of its shards at once, so by
default a batch is one wave of tasks: no more than the cluster's parallelism.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

WAVES = 1  # a batch's tasks by default: at most this many per slot of the cluster's parallelism


def shards_per_task(shards: int, option: int | None, parallelism: int | None) -> int:
    """Shards per task: the ``shardsPerTask`` option if set, else as few as keep ``shards``
    within ``WAVES`` tasks per slot of ``parallelism`` (the driver's CPU count if unknown)."""
    if option is not None:
        return option
    slots = parallelism if parallelism and parallelism > 0 else (os.cpu_count() or 1)
    return max(1, -(-shards // (WAVES * slots)))


def group(reads: Sequence[T], per_task: int) -> list[tuple[T, ...]]:
    """``reads`` in consecutive groups of at most ``per_task``, their sizes differing by at
    most one, order kept."""
    if not reads:
        return []
    tasks = -(-len(reads) // per_task)
    n = len(reads)
    return [tuple(reads[i * n // tasks:(i + 1) * n // tasks]) for i in range(tasks)]
