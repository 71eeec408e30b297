"""Waiting on conditions with a deadline (never sleep-and-hope)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    condition: Callable[[], T],
    timeout: float = 60.0,
    interval: float = 0.1,
    what: str | Callable[[], str] = "",
) -> T:
    """Poll ``condition`` until it returns a truthy value; fail with ``what`` at the deadline
    (a callable is asked then, to describe the state the wait ended in)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {said or condition}")
        time.sleep(interval)
