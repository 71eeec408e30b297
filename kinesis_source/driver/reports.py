"""The driver's listener for executors' tip reports (see ``kinesis_source/tip_reports.py``).

It runs on the planner's event loop, so a report is applied to the tip table between two
answers, never during one. Anything malformed, oversized, slow or without the run's token is
dropped (and counted): a report can only spare the driver a probe.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import socket
from collections.abc import Callable

from kinesis_source.tip_reports import MAX_MESSAGE_BYTES, ReportAddress, TipReport, decode

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 10.0


def default_host() -> str:
    """The address executors most likely reach the driver at: the host name's address."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


class TipListener:
    """A TCP listener that hands each valid message's tips to ``on_tips``."""

    def __init__(self, host: str, on_tips: Callable[[list[TipReport]], None]) -> None:
        self.host = host
        self._on_tips = on_tips
        self._token = secrets.token_urlsafe(24)
        self._server: asyncio.AbstractServer | None = None
        self.address: ReportAddress | None = None
        self.refused = 0  # messages dropped

    async def start(self) -> ReportAddress:
        """Listen on a free port of the host; the address executors are to send to."""
        if self.address is None:
            self._server = await asyncio.start_server(self._handle, self.host, 0, limit=MAX_MESSAGE_BYTES)
            port = self._server.sockets[0].getsockname()[1]
            self.address = ReportAddress(self.host, port, self._token)
            log.info("listening for executors' tip reports on %s:%d", self.host, port)
        return self.address

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), READ_TIMEOUT_S)
            token, tips = decode(line)
            if not hmac.compare_digest(token.encode(), self._token.encode()):
                raise ValueError("wrong token")
            self._on_tips(tips)
            writer.write(b"ok\n")
            await writer.drain()
        except (ValueError, asyncio.TimeoutError, asyncio.LimitOverrunError, ConnectionError) as exc:
            self.refused += 1
            log.debug("dropped a tip report: %s", exc)
        finally:
            writer.close()

    def close(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.close()
            self._server = None
