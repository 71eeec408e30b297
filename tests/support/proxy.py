"""A small HTTP reverse proxy in front of the local AWS endpoint, for tests.

It forwards every request unchanged and records, per request, the API operation (from
``X-Amz-Target``) and the access key id that signed it (from ``Authorization``). Tests use it
to count calls and to check which credentials each process used. Listens on 127.0.0.1 only.
"""

from __future__ import annotations

import http.client
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

_KEY_RE = re.compile(r"Credential=([^/]+)/")


@dataclass(frozen=True)
class Seen:
    """One forwarded request."""

    operation: str
    access_key: str | None


class RecordingProxy:
    """``with RecordingProxy(target_url) as proxy: proxy.url``; ``proxy.seen`` lists requests."""

    def __init__(self, target_url: str) -> None:
        target = urlparse(target_url)
        self._host, self._port = target.hostname, target.port
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output clean
                pass

            def _forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                target_op = self.headers.get("X-Amz-Target", "")
                key = _KEY_RE.search(self.headers.get("Authorization", ""))
                with proxy._lock:
                    proxy.seen.append(Seen(target_op.rpartition(".")[2] or self.command, key and key.group(1)))
                conn = http.client.HTTPConnection(proxy._host, proxy._port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                headers["Host"] = f"{proxy._host}:{proxy._port}"
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` of the proxy."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def operations(self) -> list[Seen]:
        """A copy of what was forwarded so far."""
        with self._lock:
            return list(self.seen)

    def __enter__(self) -> "RecordingProxy":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
