"""The embedded endpoint's server process: moto's server, with Kinesis writes made one at a time.

moto's ``Shard.put_record`` reads the shard's last sequence number and stores the next one
without a lock (its source says "not safe for concurrency"), and its server runs each request
in a thread of its own: two ``PutRecords`` on one shard at once (two Spark tasks of a sink, a
producer beside them) can get the same sequence number, and the second record overwrites the
first. Measured on a loaded 2-core machine: 2 of 1,600 concurrent puts lost. Every request
that writes records or changes shards therefore runs under one lock here; reads stay
concurrent.

``python -m kinesis_source.tools.moto_server <host> <port>``
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

# Kinesis operations that change a shard's records or the shards themselves.
_SERIAL = frozenset({
    "PutRecord", "PutRecords", "SplitShard", "MergeShards", "UpdateShardCount", "CreateStream",
    "DeleteStream", "IncreaseStreamRetentionPeriod", "DecreaseStreamRetentionPeriod",
})


class SerialWrites:
    """WSGI middleware: the Kinesis writes of the wrapped app, one at a time."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self._app = app
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        service, _, operation = target.rpartition(".")
        if service.startswith("Kinesis_") and operation in _SERIAL:
            with self._lock:
                return list(self._app(environ, start_response))  # (the body is made inside the lock)
        return self._app(environ, start_response)


def main(argv: list[str] | None = None) -> None:
    """Serve moto's Kinesis and DynamoDB on ``host`` ``port`` until killed."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from moto.server import MotoRequestHandler
    from werkzeug.serving import run_simple

    host, port = (argv if argv is not None else sys.argv[1:])[:2]
    os.environ.setdefault("MOTO_PORT", port)  # (moto builds some URLs of its answers from it)
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(host, int(port), SerialWrites(app), threaded=True, use_reloader=False,
               request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
