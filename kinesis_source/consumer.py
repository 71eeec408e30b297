"""The driver's side of enhanced fan-out: one ACTIVE consumer per stream for the query run.

The consumers are registered (when missing) and waited for on the first planning call that
needs them; partitions carry their ARNs, and executors only subscribe (``efo.py``).

``deregisterConsumer=true`` deregisters them when the query stops. Spark never calls a Python
source's ``stop()``: it ends the driver-side Python helper with SIGTERM (measured on pyspark
4.3), so the deregistration runs from a SIGTERM handler, and at interpreter exit.
"""

from __future__ import annotations

import atexit
import logging
import signal
import threading
from typing import Any

from .aws import AwsSettings, shared_client
from .efo import deregister_consumer, ensure_consumer
from .options import SourceOptions

log = logging.getLogger(__name__)


class Consumers:
    """The run's EFO consumers, by stream name."""

    def __init__(self, opts: SourceOptions) -> None:
        self._opts = opts
        self.name = opts.consumer_name or opts.application_name
        self._arns: dict[str, str] | None = None
        self._released = threading.Event()

    def _client(self) -> Any:
        return shared_client(AwsSettings.for_kinesis(self._opts), "kinesis")

    def arns(self) -> dict[str, str]:
        """Each stream's consumer ARN, registering and waiting once per run."""
        if self._arns is None:
            client = self._client()
            timeout = self._opts.consumer_timeout_ms / 1000
            self._arns = {
                stream: ensure_consumer(client, stream, self.name, timeout)
                for stream in self._opts.stream_names
            }
            if self._opts.deregister_consumer:
                self._deregister_on_exit()
        return self._arns

    def release(self) -> None:
        """Deregister the consumers (once); failures are logged, not raised: the query is
        stopping, and `kinesis-ddb consumers deregister` can finish the job."""
        if self._released.is_set() or self._arns is None:
            return
        self._released.set()
        client = self._client()
        for stream in self._opts.stream_names:
            try:
                deregister_consumer(client, stream, self.name)
                log.info("deregistered EFO consumer %s of stream %s", self.name, stream)
            except Exception as exc:  # noqa: BLE001 - best effort while stopping
                log.warning(
                    "could not deregister EFO consumer '%s' of Kinesis stream '%s' (%s); run "
                    "`kinesis-ddb consumers deregister` to remove it", self.name, stream, exc
                )

    def _deregister_on_exit(self) -> None:
        atexit.register(self.release)
        try:
            previous = signal.getsignal(signal.SIGTERM)
        except ValueError:  # pragma: no cover - not the main thread
            return

        def on_sigterm(signum: int, frame: Any) -> None:
            if self._released.is_set():
                # Spark may close the helper's socket and send SIGTERM at once: the socket's end
                # already led to stop() and its deregistration, which exiting now would cut off.
                return
            self.release()
            if callable(previous):
                previous(signum, frame)
            raise SystemExit(128 + signum)

        try:
            signal.signal(signal.SIGTERM, on_sigterm)
        except ValueError:  # signal handlers can only be set from the main thread
            log.warning(
                "deregisterConsumer=true: cannot handle SIGTERM outside the main thread; the "
                "consumer is deregistered only at a clean interpreter exit"
            )
