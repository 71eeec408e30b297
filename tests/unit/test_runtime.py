"""The driver's event-loop thread: background tasks and closing."""

from __future__ import annotations

import asyncio
import threading

from kinesis_source.driver.runtime import LoopThread


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


def test_call_runs_a_function_on_the_loop_thread_and_hands_back_its_result_or_error():
    """``call`` is how ``latestOffset`` answers without a task: the function must run on the
    loop's thread (where the tip table lives), its value and its exception reach the caller."""
    loop = LoopThread("test-loop")

    async def loop_thread() -> threading.Thread:
        return threading.current_thread()

    def boom() -> None:
        raise ValueError("from the loop")

    try:
        on_loop = loop.run(loop_thread())
        assert loop.call(threading.current_thread) is on_loop is not threading.current_thread()
        try:
            loop.call(boom)
        except ValueError as exc:
            assert str(exc) == "from the loop"
        else:
            raise AssertionError("the function's exception did not reach the caller")
    finally:

        async def nothing() -> None:
            pass

        loop.close(nothing)
