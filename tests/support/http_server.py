"""The threaded HTTP server of the local test servers (proxies, stubs)."""

from __future__ import annotations

import sys
from http.server import ThreadingHTTPServer
from typing import Any


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
