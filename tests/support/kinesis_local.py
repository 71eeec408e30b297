"""kinesis-local (the npm build of kinesis-mock) as a test server on 127.0.0.1 (or a
multi-host test's own host address).

The package binds 0.0.0.0 with no option to change it, so a private copy of ``main.js`` with the
host literal replaced by 127.0.0.1 is what runs. Every ``*_DURATION`` is 0 ms: streams and
reshards are ready at once, and a DeleteStream of a missing stream cannot delete a new stream of
the same name half a second later.

``KinesisLocal(clock=True)`` runs a server whose clock :meth:`KinesisLocal.run_ahead` moves
forward (``kinesis_local_clock.js``): what takes minutes of the server's time (an iterator's
5-minute expiry) then takes none of the test's.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from kinesis_source.tools.local import free_port

PACKAGE = Path(__file__).resolve().parents[1] / "kinesis_local" / "node_modules" / "kinesis-local"
CLOCK = Path(__file__).resolve().parent / "kinesis_local_clock.js"
_BIND_ANY = 'em("0.0.0.0")'
_DURATIONS = [
    "CREATE_STREAM_DURATION",
    "DELETE_STREAM_DURATION",
    "REGISTER_STREAM_CONSUMER_DURATION",
    "DEREGISTER_STREAM_CONSUMER_DURATION",
    "START_STREAM_ENCRYPTION_DURATION",
    "STOP_STREAM_ENCRYPTION_DURATION",
    "MERGE_SHARDS_DURATION",
    "SPLIT_SHARD_DURATION",
    "UPDATE_SHARD_COUNT_DURATION",
    "UPDATE_STREAM_MODE_DURATION",
]


class KinesisLocal:
    """``with KinesisLocal() as kl: kl.url``."""

    def __init__(self, clock: bool = False, host: str = "127.0.0.1", prefix: tuple[str, ...] = ()) -> None:
        self.clock = clock
        # a multi-host test's server: its host's own address, its command run inside that host
        # (``prefix``: ``ip netns exec <ns>``)
        self.host, self._prefix = host, prefix
        self.port: int | None = None
        self._dir: str | None = None
        self._proc: subprocess.Popen | None = None
        self._log = None

    @property
    def url(self) -> str:
        """``http://<host>:<plain port>``."""
        return f"http://{self.host}:{self.port}"

    def start(self) -> KinesisLocal:
        """Start on free ports and wait until the plain port accepts connections."""
        main_js = PACKAGE / "main.js"
        if not main_js.exists():
            raise RuntimeError(f"kinesis-local is not installed at {PACKAGE}: run ./dev setup")
        self._dir = tempfile.mkdtemp(prefix="kinesis-local-")
        source = main_js.read_text()
        if source.count(_BIND_ANY) != 1:
            raise RuntimeError("kinesis-local's bind address was not found: is it another version?")
        Path(self._dir, "main.js").write_text(source.replace(_BIND_ANY, f'em("{self.host}")'))
        shutil.copy(PACKAGE / "server.json", self._dir)  # TLS port's certificate, read from cwd
        self.port = free_port()
        env = dict(os.environ)
        env.update({name: "0ms" for name in _DURATIONS})
        env.update(
            KINESIS_MOCK_PLAIN_PORT=str(self.port),
            KINESIS_MOCK_TLS_PORT=str(free_port()),
            SHARD_LIMIT="2000",
            LOG_LEVEL="WARN",
        )
        cmd = ["node", "main.js"]
        if self.clock:
            env["KDDB_CLOCK_FILE"] = str(Path(self._dir, "clock"))
            cmd[1:1] = ["--require", str(CLOCK)]
        self._log = open(Path(self._dir, "server.log"), "wb")
        self._proc = subprocess.Popen([*self._prefix, *cmd], cwd=self._dir, env=env, stdout=self._log,
                                      stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"kinesis-local exited: {Path(self._dir, 'server.log').read_text()[-2000:]}")
            try:
                socket.create_connection((self.host, self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("kinesis-local did not start listening in 60 s")

    def run_ahead(self, seconds: float) -> None:
        """From now on the server's clock runs ``seconds`` ahead of real time (not added to an
        earlier call's). Only with ``clock=True``."""
        assert self.clock and self._proc is not None and self._dir is not None
        Path(self._dir, "clock").write_text(str(seconds))
        self._proc.send_signal(signal.SIGUSR2)

    def stop(self) -> None:
        """Stop the server and remove its private copy."""
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._log is not None:
            self._log.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> KinesisLocal:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
