"""An embedded local AWS endpoint: a moto server subprocess on a free 127.0.0.1 port (with
Kinesis writes made one at a time: ``tools/moto_server.py``).

Used by the demo and the tests. moto serves Kinesis and DynamoDB from one process; it is an
optional dependency (the ``local`` extra).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

from tenacity import retry, retry_if_exception_type, stop_after_attempt

# Credentials the local endpoint accepts; never real ones.
LOCAL_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "local",
    "AWS_SECRET_ACCESS_KEY": "local",
    "AWS_DEFAULT_REGION": "us-east-1",
}
_READY_TIMEOUT_S = 30.0


class EndpointStartError(RuntimeError):
    """The local server did not come up."""


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalEndpoint:
    """A moto server on 127.0.0.1; ``with LocalEndpoint() as ep: ep.url``."""

    def __init__(self, port: int | None = None) -> None:
        self._requested_port = port
        self.port: int | None = None
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        if self.port is None:
            raise EndpointStartError("the local endpoint is not started")
        return f"http://127.0.0.1:{self.port}"

    # A free port can be taken between probing and binding: try again on a new one.
    @retry(
        retry=retry_if_exception_type(EndpointStartError),
        stop=stop_after_attempt(3),
        reraise=True,
    )
    def start(self) -> LocalEndpoint:
        """Start the server and wait until it answers HTTP."""
        port = self._requested_port or free_port()
        cmd = [sys.executable, "-m", "kinesis_source.tools.moto_server", "127.0.0.1", str(port)]
        # moto logs every request: a file, not a pipe nobody drains (a full pipe blocks it).
        self._log = tempfile.TemporaryFile()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self._log)
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self._log.seek(0)
                err = self._log.read().decode(errors="replace")
                raise EndpointStartError(f"moto server exited on port {port}: {err[-2000:]}")
            if _answers(f"http://127.0.0.1:{port}/moto-api/"):
                self._proc, self.port = proc, port
                return self
            time.sleep(0.05)
        proc.kill()
        raise EndpointStartError(f"moto server did not answer on port {port} in time")

    def stop(self) -> None:
        """Stop the server (and wait for it)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        self._log.close()

    def reset(self) -> None:
        """Forget every stream and table (moto's reset API)."""
        req = urllib.request.Request(f"{self.url}/moto-api/reset", method="POST")
        urllib.request.urlopen(req, timeout=10).close()

    def __enter__(self) -> LocalEndpoint:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=1).close()
        return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
