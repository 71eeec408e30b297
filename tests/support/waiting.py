"""Waiting on conditions with a deadline (never sleep-and-hope)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    condition: Callable[[], T], timeout: float = 60.0, interval: float = 0.1, what: str = ""
) -> T:
    """Poll ``condition`` until it returns a truthy value; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what or condition}")
        time.sleep(interval)
