"""The driver's listener for executors' tip reports (see ``kinesis_source/tip_reports.py``).

It runs on the planner's event loop, so a report is applied to the tip table between two
answers, never during one. Anything malformed, oversized, slow or without the run's token is
dropped (and counted): a report can only spare the driver a probe.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import os
import secrets
import socket
from collections.abc import Callable

from kinesis_source.tip_reports import MAX_MESSAGE_BYTES, ReportAddress, TipReport, decode

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 10.0


def default_host() -> str:
    """The address executors most likely reach the driver at, found as Spark finds the
    driver's own (``Utils.findLocalInetAddress``): ``SPARK_LOCAL_IP`` if set; else the host
    name's address unless it is loopback (Debian's and many containers' ``/etc/hosts`` map the
    host name to 127.0.1.1); else the first IPv4 address, neither loopback nor link-local, of an
    interface that is up, by interface index; else loopback, which executors on other hosts
    cannot reach (:func:`is_loopback`)."""
    chosen = os.environ.get("SPARK_LOCAL_IP", "").strip()
    if chosen:
        return chosen
    try:
        named = socket.gethostbyname(socket.gethostname())
    except OSError:
        named = "127.0.0.1"
    if not is_loopback(named):
        return named
    for address in interface_addresses():
        if not is_loopback(address) and not ipaddress.ip_address(address).is_link_local:
            return address
    return named


def is_loopback(host: str) -> bool:
    """True for an address (or name) only this machine reaches."""
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def interface_addresses() -> list[str]:
    """The IPv4 addresses of this machine's interfaces that are up, by interface index (Linux;
    empty elsewhere). Nothing is sent: each address is read with one ``ioctl``."""
    try:
        import fcntl
        import struct
    except ImportError:  # not a POSIX system
        return []
    out = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            packed = struct.pack("256s", name.encode()[:15])
            try:
                flags = struct.unpack("H", fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, packed)[16:18])[0]
                if not flags & _IFF_UP:
                    continue
                out.append(socket.inet_ntoa(fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, packed)[20:24]))
            except OSError:  # no IPv4 address, or not Linux
                continue
    return out


# Linux's ioctl requests for an interface's flags and IPv4 address, and the "up" flag
_SIOCGIFFLAGS, _SIOCGIFADDR, _IFF_UP = 0x8913, 0x8915, 0x1


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
