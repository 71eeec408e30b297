"""The driver's event loop, run in a thread of its own.

Spark's driver-side helper calls the reader synchronously and only when it needs an answer; the
tip table and shard discovery must go on between those calls. So the planner's coroutines run
on one asyncio loop in a daemon thread, and each synchronous call waits for its coroutine there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 10.0  # how long close() waits for the background tasks to stop
LAST_TIMEOUT_S = 10.0  # and then for its last step (closing clients)


class LoopThread:
    """An event loop in a daemon thread, started on first use, with background tasks."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: list[asyncio.Task] = []

    @property
    def started(self) -> bool:
        """True once a coroutine ran (and until :meth:`close`)."""
        return self._loop is not None

    def run(self, coro: Awaitable[T]) -> T:
        """Run ``coro`` on the loop and wait for its result (or its exception)."""
        return asyncio.run_coroutine_threadsafe(coro, self._started()).result()  # type: ignore[arg-type]

    def post(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the loop soon, without waiting for it (its error is logged)."""

        def step() -> None:
            try:
                fn()
            except Exception:  # noqa: BLE001 - nobody waits for it: logged
                log.exception("%s: a posted call failed", self._name)

        self._started().call_soon_threadsafe(step)

    def _started(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name=self._name, daemon=True)
            self._thread.start()
        return self._loop

    def spawn(self, coro: Coroutine[Any, Any, Any], on_error: Callable[[BaseException], None]) -> None:
        """Start ``coro`` as a background task (call from the loop); ``on_error`` gets what
        ends it other than cancellation."""

        def done(task: asyncio.Task) -> None:
            if not task.cancelled() and task.exception() is not None:
                on_error(task.exception())  # type: ignore[arg-type]

        task = asyncio.ensure_future(coro)
        task.add_done_callback(done)
        self._tasks.append(task)

    def close(self, last: Callable[[], Awaitable[None]]) -> None:
        """Cancel the background tasks, run ``last()`` on the loop, then stop it."""
        if self._loop is None:
            return

        async def shutdown() -> None:
            # Cancelled again while any is left: a task can swallow one cancellation (on Python
            # 3.11, asyncio.wait_for does when its awaitable completes at the same moment).
            pending = set(self._tasks)
            deadline = time.monotonic() + CLOSE_TIMEOUT_S
            while pending and time.monotonic() < deadline:
                for task in pending:
                    task.cancel()
                _, pending = await asyncio.wait(pending, timeout=0.5)
            if pending:
                log.warning("%d background task(s) of %s did not stop within %.0f s",
                            len(pending), self._name, CLOSE_TIMEOUT_S)
            self._tasks.clear()
            await last()

        # Bounded: a loop stuck in a call must not keep the run from stopping (and from leaving
        # its EFO consumers, which comes after).
        done = asyncio.run_coroutine_threadsafe(shutdown(), self._loop)
        stuck = False
        try:
            done.result(timeout=CLOSE_TIMEOUT_S + LAST_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            stuck = True
            log.warning("%s did not close within %.0f s; stopping it anyway", self._name,
                        CLOSE_TIMEOUT_S + LAST_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - closing: what failed is logged, the rest goes on
            log.exception("%s: closing failed", self._name)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None and not stuck:
            self._thread.join(timeout=10)
        if self._thread is None or not self._thread.is_alive():
            self._loop.close()  # (a stuck loop is left to its daemon thread, ended with the process)
        self._loop = None
