"""Sending a task's tip reports to the driver (see ``kinesis_source/tip_reports.py``).

A report is an optimisation: sending it never fails a task. A driver that cannot be reached (a
firewall, a helper that stopped) is not tried again by this worker for ``UNREACHABLE_PAUSE_S``,
so a task pays at most one connection timeout per pause.
"""

from __future__ import annotations

import logging
import socket
import time

from kinesis_source.tip_reports import ReportAddress, TipReport, encode

log = logging.getLogger(__name__)

SEND_TIMEOUT_S = 1.0  # connect, send and the driver's "ok" together, at most
UNREACHABLE_PAUSE_S = 60.0

_unreachable_until: dict[tuple[str, int], float] = {}


def send_reports(address: ReportAddress, tips: list[TipReport]) -> bool:
    """Send ``tips``; True when the driver said it applied them."""
    if not tips:
        return True
    where = (address.host, address.port)
    if _unreachable_until.get(where, 0.0) > time.monotonic():
        return False
    try:
        with socket.create_connection(where, timeout=SEND_TIMEOUT_S) as sock:
            sock.settimeout(SEND_TIMEOUT_S)
            sock.sendall(encode(address.token, tips))
            reply = sock.makefile("rb").readline(16)
    except OSError as exc:
        _unreachable_until[where] = time.monotonic() + UNREACHABLE_PAUSE_S
        log.info(
            "could not report tips to the driver at %s:%d (%s); the driver probes those shards "
            "itself (set tipReportHost to an address executors reach, or tipReports=false)",
            address.host, address.port, type(exc).__name__,
        )
        return False
    return reply.strip() == b"ok"
