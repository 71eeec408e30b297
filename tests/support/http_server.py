"""The threaded HTTP server of the local test servers (proxies, stubs)."""

from __future__ import annotations

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

S = TypeVar("S", bound="LocalService")


class LocalHTTPServer(ThreadingHTTPServer):
    """A :class:`ThreadingHTTPServer` that stays quiet when a client goes away mid-call (a query
    stopped, a task killed): that is the client's news, not the server's. Anything else is still
    printed."""

    daemon_threads = True
    # a hundred subscriptions may connect at once, as to Kinesis: no connection is dropped from
    # a full accept queue (the default holds 5)
    request_queue_size = 256

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Print the error unless it is a dropped connection."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class LocalService:
    """A server on a free 127.0.0.1 port answering with ``handler`` in a thread of its own:
    ``with`` starts and stops it, ``url`` names it."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._server = LocalHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self: S) -> S:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
