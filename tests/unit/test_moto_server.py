"""The embedded endpoint's moto wrapper: Kinesis writes one at a time, everything else at once."""

from __future__ import annotations

import threading

from kinesis_source.tools.moto_server import SerialWrites

MEET_S = 2.0  # how long a request waits for a second one to be inside the app with it


def _met(target: str) -> bool:
    """Two requests to ``target`` at once through the wrapper: True when both were inside the
    wrapped app together (each waits there, up to ``MEET_S``, for the other to come in)."""
    meeting = threading.Barrier(2, timeout=MEET_S)
    met: list[bool] = []

    def app(environ, start_response):
        try:
            meeting.wait()
            met.append(True)
        except threading.BrokenBarrierError:
            met.append(False)
        start_response("200 OK", [])
        return iter([b"{}"])

    wrapped = SerialWrites(app)
    threads = [threading.Thread(target=lambda: list(wrapped({"HTTP_X_AMZ_TARGET": target}, lambda *a: None)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return all(met) and len(met) == 2


def test_puts_to_kinesis_run_one_at_a_time():
    assert not _met("Kinesis_20131202.PutRecords")
    assert not _met("Kinesis_20131202.PutRecord")


def test_reads_and_other_services_run_at_once():
    assert _met("Kinesis_20131202.GetRecords")
    assert _met("DynamoDB_20120810.PutItem")
