"""The driver's event-loop thread: background tasks and closing."""

from __future__ import annotations

import asyncio
import threading

from kinesis_source.driver.runtime import LoopThread
from tests.support.waiting import wait_for


def test_close_stops_a_background_task_that_swallowed_one_cancellation():
    """On Python 3.11 ``asyncio.wait_for`` can swallow a cancellation; ``close`` must still
    return, with the task stopped, instead of waiting for it forever."""
    loop = LoopThread("test-loop")
    cancels = []

    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancels.append(1)
                if len(cancels) >= 2:
                    raise

    async def start() -> None:
        loop.spawn(stubborn(), lambda exc: None)

    loop.run(start())
    closed = threading.Event()

    async def last() -> None:
        closed.set()

    worker = threading.Thread(target=loop.close, args=(last,), daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "close() hung on a task that swallowed a cancellation"
    assert closed.is_set() and len(cancels) == 2


def test_post_runs_a_function_on_the_loop_thread_without_waiting_for_it():
    """``post`` is how ``latestOffset`` hands the loop what only the loop may do (scheduling
    probes): the function runs on the loop's thread; the caller does not wait for it."""
    loop = LoopThread("test-loop")
    ran: list[threading.Thread] = []
    release = threading.Event()

    async def loop_thread() -> threading.Thread:
        return threading.current_thread()

    def blocked() -> None:
        release.wait(10)
        ran.append(threading.current_thread())

    try:
        on_loop = loop.run(loop_thread())
        loop.post(blocked)  # returns at once although the function waits
        assert not ran
        release.set()
        wait_for(lambda: ran, timeout=10, what="the posted function")
        assert ran == [on_loop]
    finally:

        async def nothing() -> None:
            pass

        loop.close(nothing)


def test_close_returns_when_the_loop_is_stuck_in_a_blocking_call(monkeypatch):
    """A loop thread blocked in a synchronous call cannot run the shutdown: ``close`` gives up
    after its timeouts instead of hanging, so what comes after it when a run stops (leaving
    its EFO consumers) still happens."""
    from kinesis_source.driver import runtime

    monkeypatch.setattr(runtime, "CLOSE_TIMEOUT_S", 0.5)
    monkeypatch.setattr(runtime, "LAST_TIMEOUT_S", 0.5)
    loop = LoopThread("test-loop")
    unblock = threading.Event()
    loop.post(lambda: unblock.wait(30))  # the loop's thread is held here
    worker = threading.Thread(target=loop.close, args=(_nothing,), daemon=True)
    worker.start()
    try:
        worker.join(timeout=15)
        assert not worker.is_alive(), "close() hung on a loop stuck in a blocking call"
    finally:
        unblock.set()


async def _nothing() -> None:
    pass
