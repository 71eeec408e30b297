"""The event-stream test server in a process of its own, for benchmarks.

In the benchmark's process, a hundred subscriptions' threads share one interpreter with the
producer and ``foreachBatch``: the producer's calls then wait for the GIL, and the latency it
stamps measures the harness rather than the query. Here the server runs in a child process
(``spawn``: no copy of the parent's threads or JVM gateway) and its counters are read over a
pipe.

    with EfoServerProcess(moto_url, in_use_window_s=5.0) as server:
        server.url; server.counters()["refused"]
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.connection import Connection
from typing import Any

START_TIMEOUT_S = 60.0


def _serve(conn: Connection, backing_url: str, knobs: dict[str, Any], attrs: dict[str, Any]) -> None:
    from tests.support.efo_server import EfoServer

    with EfoServer(backing_url, **knobs) as server:
        for name, value in attrs.items():
            setattr(server, name, value)
        conn.send(server.url)
        while True:
            try:
                what = conn.recv()
            except EOFError:  # the parent is gone
                return
            if what == "stop":
                conn.send(None)
                return
            conn.send(_counters(server))


def _counters(server: Any) -> dict[str, Any]:
    return {"refused": dict(server.refused), "subscriptions": server.subscriptions,
            "calls": dict(server.calls), "sent_bytes": server.sent_bytes,
            "sent_records": server.sent_records}


class EfoServerProcess:
    """``EfoServer(backing_url, **knobs)`` in a child process, with ``attrs`` set on it (the
    knobs its constructor does not take, such as ``in_use_window_s``)."""

    def __init__(self, backing_url: str, attrs: dict[str, Any] | None = None, **knobs: Any) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_serve, args=(child, backing_url, knobs, attrs or {}), daemon=True)
        self.url = ""

    def counters(self) -> dict[str, Any]:
        """The server's counters now: ``refused`` (by code), ``subscriptions``, ``calls`` (by
        operation), ``sent_bytes`` and ``sent_records`` (pushed to subscribers)."""
        self._conn.send("counters")
        return self._conn.recv()

    def __enter__(self) -> EfoServerProcess:
        self._process.start()
        if not self._conn.poll(START_TIMEOUT_S):
            self._process.kill()
            raise RuntimeError(f"the event-stream test server did not start within {START_TIMEOUT_S:g} s")
        self.url = self._conn.recv()
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self._conn.send("stop")
            self._conn.poll(10)
        except (BrokenPipeError, EOFError, OSError):
            pass
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)
