"""Several shards read at once in one task, their output merged as it comes.

A task holding many shards spends almost all its time waiting for Kinesis (and for each shard's
call budget), so its shards are read on threads, one shard per thread at a time. Each shard's
items keep their order; items of different shards interleave. What waits to be yielded is
bounded (``depth`` items), so a slow consumer holds back the readers instead of letting pages
pile up in memory.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class _Stopped(Exception):
    """The consumer went away (or another source failed): a reader thread stops."""


class _Buffer:
    """A bounded hand-over between reader threads and the consuming generator."""

    def __init__(self, depth: int, sources: int) -> None:
        self._items: deque = deque()
        self._depth = depth
        self._left = sources  # sources not finished yet
        self._error: BaseException | None = None
        self._stopped = False
        self._cond = threading.Condition()

    def put(self, item: object) -> None:
        with self._cond:
            while len(self._items) >= self._depth and not self._stopped:
                self._cond.wait()
            if self._stopped:
                raise _Stopped
            self._items.append(item)
            self._cond.notify_all()

    def finish(self, error: BaseException | None) -> None:
        with self._cond:
            self._left -= 1
            if error is not None and self._error is None:
                self._error = error
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def take(self) -> tuple[bool, object]:
        """(True, item), or (False, None) once every source finished; raises the first
        source's error as soon as it is known (the task fails: what waits is not needed)."""
        with self._cond:
            while not self._items and self._left and self._error is None:
                self._cond.wait()
            if self._error is not None:
                raise self._error
            if self._items:
                item = self._items.popleft()
                self._cond.notify_all()
                return True, item
            return False, None


def interleave(sources: list[Iterator[T]], threads: int, depth: int) -> Iterator[T]:
    """Every item of every source, each source's in order, read on up to ``threads`` threads
    with at most ``depth`` items waiting. The first source to fail stops the others and its
    error is raised here; closing this generator stops them too."""
    buffer = _Buffer(depth, len(sources))

    def drain(source: Iterator[T]) -> None:
        error: BaseException | None = None
        try:
            for item in source:
                buffer.put(item)
        except _Stopped:
            pass
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            error = exc
        finally:
            try:
                close = getattr(source, "close", None)
                if close is not None:
                    close()
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer
                error = error or exc
            finally:
                buffer.finish(error)  # always: the consumer waits for every source to finish

    pool = ThreadPoolExecutor(max_workers=max(1, min(threads, len(sources))), thread_name_prefix="kinesis-ddb-read")
    try:
        for source in sources:
            pool.submit(drain, source)
        while True:
            more, item = buffer.take()
            if not more:
                return
            yield item  # type: ignore[misc]
    finally:
        buffer.stop()
        pool.shutdown(wait=False, cancel_futures=True)
