"""Sending a task's tip reports to the driver (see ``kinesis_source/tip_reports.py``).

A report is an optimisation: sending it never fails a task. A driver that cannot be reached (a
firewall, a helper that stopped) is not tried again by this worker for ``UNREACHABLE_PAUSE_S``,
so a task pays at most one connection timeout per pause. A driver that takes the connection but
answers late is busy, not gone (its interpreter is shared with a thousand shards' probes, a
garbage collection, Spark's own calls): only ``LATE_LIMIT`` late answers in a row pause it, so one
slow moment does not cost the worker its reports and tip watches for a minute.
"""

from __future__ import annotations

import enum
import logging
import socket
import time

from kinesis_source.tip_reports import ReportAddress, TipReport, encode

log = logging.getLogger(__name__)

SEND_TIMEOUT_S = 1.0  # connect, send and the driver's "ok" together, at most
UNREACHABLE_PAUSE_S = 60.0
LATE_LIMIT = 3  # late answers in a row that make a driver unreachable

_unreachable_until: dict[tuple[str, int], float] = {}
_late_in_a_row: dict[tuple[str, int], int] = {}


class Delivery(enum.Enum):
    """What became of a message of reports."""

    APPLIED = "applied"  # the driver answered "ok"
    REFUSED = "refused"  # not reached, or not taken (the query stopped, another run's token)
    LATE = "late"  # sent, but not answered in time: the driver may have applied it, and is there


def send_reports(address: ReportAddress, tips: list[TipReport]) -> Delivery:
    """Send ``tips`` in one message and say what became of it."""
    if not tips:
        return Delivery.APPLIED
    where = (address.host, address.port)
    if _unreachable_until.get(where, 0.0) > time.monotonic():
        return Delivery.REFUSED
    try:
        sock = socket.create_connection(where, timeout=SEND_TIMEOUT_S)
    except OSError as exc:
        _pause(address, exc)
        return Delivery.REFUSED
    with sock:
        try:
            sock.settimeout(SEND_TIMEOUT_S)
            sock.sendall(encode(address.token, tips))
            reply = sock.makefile("rb").readline(16)
        except TimeoutError as exc:
            late = _late_in_a_row[where] = _late_in_a_row.get(where, 0) + 1
            if late >= LATE_LIMIT:
                _pause(address, exc)
            return Delivery.LATE
        except OSError as exc:
            _pause(address, exc)
            return Delivery.REFUSED
    _late_in_a_row.pop(where, None)
    return Delivery.APPLIED if reply.strip() == b"ok" else Delivery.REFUSED


def _pause(address: ReportAddress, exc: OSError) -> None:
    where = (address.host, address.port)
    _unreachable_until[where] = time.monotonic() + UNREACHABLE_PAUSE_S
    _late_in_a_row.pop(where, None)
    log.info(
        "could not report tips to the driver at %s:%d (%s); the driver probes those shards "
        "itself for %.0f s (set tipReportHost to an address executors reach, or tipReports=false)",
        address.host, address.port, type(exc).__name__, UNREACHABLE_PAUSE_S,
    )
