"""Shards grouped into tasks, and a task's shards read at once (``driver/tasks.py``,
``executor/interleave.py``)."""

from __future__ import annotations

import threading
import time

import pytest

from kinesis_source.driver.tasks import group, shards_per_task
from kinesis_source.executor.interleave import interleave
from tests.support.waiting import wait_for


def test_default_shards_per_task_keeps_a_batch_within_one_wave_of_the_parallelism():
    assert shards_per_task(2, None, 2) == 1  # no more shards than slots: one shard per task
    assert shards_per_task(10, None, 4) == 3  # 4 slots: ceil(10 / 4)
    assert shards_per_task(1000, None, 8) == 125  # 8 tasks at most
    assert shards_per_task(1000, 5, 8) == 5  # the option wins
    assert shards_per_task(0, None, 8) == 1


@pytest.mark.parametrize("n,per_task", [(1, 1), (10, 3), (10, 1), (7, 7), (1000, 63), (5, 100)])
def test_groups_keep_order_hold_every_read_once_and_are_even(n, per_task):
    reads = list(range(n))
    groups = group(reads, per_task)
    assert [r for g in groups for r in g] == reads
    assert all(1 <= len(g) <= per_task for g in groups)
    assert max(map(len, groups)) - min(map(len, groups)) <= 1
    assert len(groups) == -(-n // per_task)


def test_interleave_keeps_each_sources_order_and_reads_sources_at_once():
    started = threading.Barrier(3, timeout=10)

    def source(name: str, count: int):
        started.wait()  # all three run at the same time, or this times out
        for i in range(count):
            yield (name, i)

    out = list(interleave([source("a", 50), source("b", 20), source("c", 0)], threads=3, depth=4))
    for name, count in (("a", 50), ("b", 20)):
        assert [i for n, i in out if n == name] == list(range(count))
    assert len(out) == 70


def test_interleave_raises_the_first_failure_and_stops_the_other_sources():
    stopped = threading.Event()

    def endless():
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            stopped.set()

    def failing():
        yield -1
        raise RuntimeError("shard read failed")

    with pytest.raises(RuntimeError, match="shard read failed"):
        for _ in interleave([endless(), failing()], threads=2, depth=2):
            pass
    wait_for(stopped.is_set, timeout=10, what="the other source to be closed")


def test_interleave_bounds_what_waits_and_closing_it_stops_the_readers():
    produced = []
    closed = threading.Event()

    def source():
        try:
            for i in range(1000):
                produced.append(i)
                yield i
        finally:
            closed.set()

    gen = interleave([source()], threads=1, depth=3)
    assert next(gen) == 0
    # one taken, three waiting, one more made and blocked in put: then the reader must stop
    wait_for(lambda: len(produced) == 5, timeout=10, what="the reader to fill the buffer")
    time.sleep(0.2)  # time in which an unbounded reader would run far ahead
    assert len(produced) == 5
    gen.close()
    wait_for(closed.is_set, timeout=10, what="the reader to stop after the consumer left")


def test_interleave_finishes_when_closing_a_source_fails():
    """A source whose close fails (a subscription that will not close) must still count as
    finished, or the task would wait for it forever; its error reaches the consumer."""

    class Unclosable:
        def __init__(self):
            self.items = iter([1, 2])

        def __iter__(self):
            return self

        def __next__(self):
            return next(self.items)

        def close(self):
            raise OSError("cannot close")

    def fine():
        yield 3

    done = threading.Event()
    failures = []

    def consume():
        try:
            list(interleave([Unclosable(), fine()], threads=2, depth=4))
        except OSError as exc:
            failures.append(exc)
        done.set()

    threading.Thread(target=consume, daemon=True).start()
    wait_for(done.is_set, timeout=10, what="interleave to finish")
    assert [str(e) for e in failures] == ["cannot close"]
