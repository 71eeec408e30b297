"""The embedded endpoint's moto wrapper: Kinesis writes one at a time, everything else at once."""

from __future__ import annotations

import threading
import time

from kinesis_source.tools.moto_server import SerialWrites


class _SlowApp:
    """A WSGI app that takes a while per request and notes the most requests it ran at once."""

    def __init__(self) -> None:
        self.running = self.most = 0
        self._lock = threading.Lock()

    def __call__(self, environ, start_response):
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(0.05)
        with self._lock:
            self.running -= 1
        start_response("200 OK", [])
        return iter([b"{}"])


def _most_at_once(target: str) -> int:
    app = _SlowApp()
    wrapped = SerialWrites(app)
    threads = [threading.Thread(target=lambda: list(wrapped({"HTTP_X_AMZ_TARGET": target}, lambda *a: None)))
               for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return app.most


def test_puts_to_kinesis_run_one_at_a_time():
    assert _most_at_once("Kinesis_20131202.PutRecords") == 1
    assert _most_at_once("Kinesis_20131202.PutRecord") == 1


def test_reads_and_other_services_run_at_once():
    assert _most_at_once("Kinesis_20131202.GetRecords") > 1
    assert _most_at_once("DynamoDB_20120810.PutItem") > 1
