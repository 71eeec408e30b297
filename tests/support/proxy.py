"""A fault-injecting HTTP reverse proxy in front of a local AWS endpoint, for tests.

It forwards requests and records, per request, the API operation (from ``X-Amz-Target``) and the
access key id that signed it. Rules make it misbehave the way AWS does:

- ``throttle(ops, fraction)``: answer that fraction of those calls with a throttling error;
- ``fail(ops, fraction, status)``: answer with a 5xx;
- ``latency = seconds``: delay every request;
- ``trim(stream, shard, first_seq)``: simulate retention: iterators asked for before
  ``first_seq`` (or at TRIM_HORIZON) land at ``first_seq``, as Kinesis' do after a trim;
- ``gap(stream, shard, pages)``: make that shard sparse as real Kinesis serves one: every
  ``TRIM_HORIZON`` iterator crosses ``pages`` empty pages (``MillisBehindLatest`` > 0) before
  its first record;
- ``expire(stream, shard, listed)``: simulate a shard past its retention: ``GetShardIterator``
  for it answers ``ResourceNotFoundException`` as Kinesis does for a missing shard, and unless
  ``listed``, ``ListShards`` leaves it out;
- ``fail_records(fraction, code, stream)``: fail that fraction of the records of each
  ``PutRecords``: they are not forwarded (so not written), and the answer carries
  ``{"ErrorCode": code, "ErrorMessage": ...}`` at their positions, as AWS' partial failures do;
- ``down = True``: drop every connection without an answer (recorded in ``seen`` as
  :data:`DROPPED`).

A ``PutRecords`` some of whose records the proxy answers itself (these rules, or a subclass's
quota) is forwarded with the others only, in their order, and the backend's answer is merged back
into one entry per record of the request (``tests/support/put_records.py``); if none is left, the
proxy answers without forwarding.
Writes to one stream are forwarded one at a time: moto server's concurrent ``PutRecords`` to a
shard can hand out one sequence number twice and lose a record.

Listens on 127.0.0.1 (or a multi-host test's own bridge address, ``host``); the random choices
are seeded, so a run is repeatable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import random
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlparse

from tests.support.http_server import LocalHTTPServer
from tests.support.put_records import (
    INTERNAL_FAILURE,
    THROTTLED,
    ShardMap,
    hash_key,
    merged,
    record_error,
    without,
)

_KEY_RE = re.compile(r"Credential=([^/]+)/")
DROPPED = "dropped"  # ``Seen.injected`` of a request dropped while ``down``
# ``Seen.injected`` of a request whose body ended before its Content-Length: the client died
# between its header and body writes (a SIGKILL). No server would act on it, so neither does this.
TRUNCATED = "truncated"
NOT_FOUND = "ResourceNotFoundException"


def _error(code: str, message: str) -> bytes:
    """An AWS JSON error body."""
    return json.dumps({"__type": code, "message": message}).encode()


def _request(body: bytes) -> dict[str, Any]:
    try:
        return json.loads(body) if body.startswith(b"{") else {}
    except ValueError:
        return {}


def _stream_of(req: dict[str, Any]) -> str | None:
    if req.get("StreamName"):
        return req["StreamName"]
    arn = req.get("StreamARN") or req.get("ConsumerARN") or ""
    # arn:aws:kinesis:<region>:<account>:stream/<name>[/consumer/...]
    _, _, rest = arn.partition(":stream/")
    return rest.split("/", 1)[0] or None


@dataclass(frozen=True)
class Seen:
    """One request, and what the proxy did with it."""

    operation: str
    access_key: str | None
    injected: str | None = None  # the error answered instead of forwarding, if any
    shard: tuple[str, str] | None = None  # (stream, shard id) a data-plane call was about
    client: str | None = None  # "async" (aiobotocore: the driver) or "sync" (boto3)
    at: float = 0.0  # time.monotonic() when it came in


class FaultProxy:
    """``with FaultProxy(target_url) as proxy: proxy.url``; ``proxy.seen`` lists requests."""

    def __init__(self, target_url: str, seed: int = 7, host: str = "127.0.0.1") -> None:
        target = urlparse(target_url)
        self._host, self._port = target.hostname, target.port
        self.seen: list[Seen] = []
        self.latency = 0.0
        self.down = False
        self._rules: list[tuple[set[str], float, int, str]] = []
        self._trims: dict[tuple[str, str], str] = {}
        self._gaps: dict[tuple[str, str], int] = {}
        self._expired: dict[tuple[str, str], bool] = {}  # -> still listed
        self._record_rules: list[tuple[float, str, str | None]] = []  # (fraction, code, stream)
        self._records_failed: Counter[str] = Counter()
        self._shards = ShardMap(target_url)
        self._write_locks: dict[str | None, threading.Lock] = {}  # per stream
        self.gap_pages_served = 0
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._server = LocalHTTPServer((host, 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    # -- rules ---------------------------------------------------------------------------

    def throttle(self, ops: set[str], fraction: float) -> None:
        """Answer ``fraction`` of the calls to ``ops`` with a throttling error (HTTP 400)."""
        self._rules.append((set(ops), fraction, 400, THROTTLED))

    def fail(self, ops: set[str], fraction: float, status: int = 500, code: str = "InternalFailure") -> None:
        """Answer ``fraction`` of the calls to ``ops`` with an error (a server error by default)."""
        self._rules.append((set(ops), fraction, status, code))

    def fail_records(self, fraction: float, code: str = INTERNAL_FAILURE, stream: str | None = None) -> None:
        """Fail ``fraction`` of the records of each ``PutRecords`` (to ``stream``, or to any): they
        are not written, and their entries in the answer carry ``code`` and AWS' message for it."""
        with self._lock:
            self._record_rules.append((fraction, code, stream))

    def clear(self) -> None:
        """Forget every rule."""
        with self._lock:
            self._rules.clear()
            self._record_rules.clear()
            self._trims.clear()
            self._gaps.clear()
            self._expired.clear()
            self.latency, self.down = 0.0, False

    def trim(self, stream: str, shard: str, first_seq: str) -> None:
        """Records before ``first_seq`` of that shard are gone, as after retention."""
        self._trims[(stream, shard)] = first_seq

    def gap(self, stream: str, shard: str, pages: int) -> None:
        """Every TRIM_HORIZON iterator of that shard crosses ``pages`` empty pages first."""
        self._gaps[(stream, shard)] = pages

    def expire(self, stream: str, shard: str, listed: bool = False) -> None:
        """The shard is gone (past retention); ``listed``: ListShards still shows it, as in
        the moment between a listing and the next call."""
        self._expired[(stream, shard)] = listed

    def operations(self) -> list[Seen]:
        """A copy of what came in so far."""
        with self._lock:
            return list(self.seen)

    def injected(self, code: str) -> int:
        """How many answers were that injected error."""
        return sum(1 for s in self.operations() if s.injected == code)

    def failed_records(self, code: str | None = None) -> int:
        """How many ``PutRecords`` entries a :meth:`fail_records` rule failed (with ``code``)."""
        with self._lock:
            return sum(self._records_failed.values()) if code is None else self._records_failed[code]

    # -- the hooks a request goes through (a subclass extends them) ------------------------

    def _record(self, call: Seen) -> None:
        with self._lock:
            self.seen.append(call)

    def _describe(self, call: Seen, body: bytes) -> Seen:
        """The call with what a subclass learns from its body."""
        return call

    def _intercept(self, call: Seen, body: bytes) -> tuple[int, bytes] | None:
        """Answer the request here instead of forwarding it (status, body), or ``None``.
        Records the call."""
        op = call.operation
        decision = self._decide(op)
        if decision is not None:
            self._record(dataclasses.replace(call, injected=decision[1]))
            status, code = decision
            return status, _error(code, f"injected by the test proxy: {code}")
        missing = self._missing_shard(op, body)
        if missing is not None:
            self._record(dataclasses.replace(call, injected=NOT_FOUND))
            return 400, missing
        self._record(call)
        return self._gap_page(op, body)

    def _unwritten(self, call: Seen, body: bytes) -> dict[int, dict[str, str]]:
        """The records of a ``PutRecords`` the proxy fails instead of forwarding: position -> the
        entry answered for it. Asked only of calls :meth:`_intercept` let through."""
        if call.operation != "PutRecords" or not self._record_rules:
            return {}
        req = _request(body)
        stream, records = _stream_of(req), req.get("Records") or []
        chosen: dict[int, str] = {}
        with self._lock:
            for i in range(len(records)):
                for fraction, code, only in self._record_rules:
                    if only in (None, stream) and self._random.random() < fraction:
                        chosen[i] = code
                        self._records_failed[code] += 1
                        break
        # Only a throttling message names the shard: the others cost no ListShards.
        named = [i for i, code in chosen.items() if code == THROTTLED]
        owners = dict(zip(named, self._shards.shards(stream, [hash_key(records[i]) for i in named]), strict=True))
        return {i: record_error(code, stream, owners.get(i)) for i, code in chosen.items()}

    def _forwarding(self, op: str, body: bytes) -> contextlib.AbstractContextManager[Any]:
        """Held while the request is forwarded: a write holds its stream's lock."""
        if op not in ("PutRecords", "PutRecord"):
            return contextlib.nullcontext()
        stream = _stream_of(_request(body))
        with self._lock:
            return self._write_locks.setdefault(stream, threading.Lock())

    def _outgoing(self, op: str, body: bytes) -> bytes:
        """The request body forwarded to the server."""
        return self._rewrite(op, self._unwrap_gap(op, body))

    def _transform(self, call: Seen, body: bytes, status: int, data: bytes) -> bytes:
        """The server's answer as the client gets it."""
        op = call.operation
        return self._unlist(op, body, status, self._wrap_gap(op, body, status, data))

    # -- serving -------------------------------------------------------------------------

    def _decide(self, op: str) -> tuple[int, str] | None:
        with self._lock:
            for ops, fraction, status, code in self._rules:
                if op in ops and self._random.random() < fraction:
                    return status, code
        return None

    def _rewrite(self, op: str, body: bytes) -> bytes:
        if op != "GetShardIterator" or not self._trims:
            return body
        req = json.loads(body)
        first = self._trims.get((req.get("StreamName"), req.get("ShardId")))
        if first is None:
            return body
        kind = req.get("ShardIteratorType")
        seq = req.get("StartingSequenceNumber")
        if kind == "TRIM_HORIZON" or (seq is not None and int(seq) < int(first)):
            req.update(ShardIteratorType="AT_SEQUENCE_NUMBER", StartingSequenceNumber=first)
            return json.dumps(req).encode()
        return body

    def _missing_shard(self, op: str, body: bytes) -> bytes | None:
        if op != "GetShardIterator" or not self._expired:
            return None
        req = json.loads(body)
        stream, shard = req.get("StreamName"), req.get("ShardId")
        if (stream, shard) not in self._expired:
            return None
        return _error(NOT_FOUND, f"Shard {shard} in stream {stream} under account 123456789012 does not exist")

    def _unlist(self, op: str, body: bytes, status: int, data: bytes) -> bytes:
        if op != "ListShards" or status != 200 or not self._expired:
            return data
        stream = json.loads(body).get("StreamName")
        gone = {shard for (st, shard), listed in self._expired.items() if st == stream and not listed}
        if not gone:
            return data
        resp = json.loads(data)
        resp["Shards"] = [s for s in resp.get("Shards", []) if s["ShardId"] not in gone]
        return json.dumps(resp).encode()

    # A gap iterator is "gap|<empty pages left>|<the server's iterator>".

    def _wrap_gap(self, op: str, body: bytes, status: int, data: bytes) -> bytes:
        if op != "GetShardIterator" or status != 200 or not self._gaps:
            return data
        req = json.loads(body)
        pages = self._gaps.get((_stream_of(req), req.get("ShardId")))
        if not pages or req.get("ShardIteratorType") != "TRIM_HORIZON":
            return data
        resp = json.loads(data)
        resp["ShardIterator"] = f"gap|{pages}|{resp['ShardIterator']}"
        return json.dumps(resp).encode()

    def _gap_page(self, op: str, body: bytes) -> tuple[int, bytes] | None:
        if op != "GetRecords" or not body.startswith(b'{') or b'"gap|' not in body:
            return None
        req = json.loads(body)
        _, left, inner = req["ShardIterator"].split("|", 2)
        if int(left) == 0:
            return None
        with self._lock:
            self.gap_pages_served += 1
        nxt = f"gap|{int(left) - 1}|{inner}"
        return 200, json.dumps(
            {"Records": [], "NextShardIterator": nxt, "MillisBehindLatest": 86_400_000}
        ).encode()

    def _unwrap_gap(self, op: str, body: bytes) -> bytes:
        if op != "GetRecords" or b'"gap|' not in body:
            return body
        req = json.loads(body)
        req["ShardIterator"] = req["ShardIterator"].split("|", 2)[2]
        return json.dumps(req).encode()

    def _handler(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as separate writes

            def log_message(self, *args):  # keep test output clean
                pass

            def _reply(self, status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
                self.send_response(status)
                for k, v in headers:
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                op = self.headers.get("X-Amz-Target", "").rpartition(".")[2] or self.command
                key = _KEY_RE.search(self.headers.get("Authorization", ""))
                agent = self.headers.get("User-Agent", "")
                call = Seen(
                    op, key and key.group(1), client="async" if "aiobotocore" in agent else "sync", at=time.monotonic()
                )
                if proxy.down or len(body) < length:
                    proxy._record(dataclasses.replace(call, injected=DROPPED if proxy.down else TRUNCATED))
                    self.close_connection = True
                    return
                if proxy.latency:
                    time.sleep(proxy.latency)
                call = proxy._describe(call, body)
                answer = proxy._intercept(call, body)
                unwritten = proxy._unwritten(call, body) if answer is None else {}
                forwarded = without(body, unwritten)
                if forwarded is None:  # every record failed here: nothing to write
                    answer = 200, merged(b'{"FailedRecordCount": 0, "Records": []}', unwritten)
                if answer is not None:
                    status, data = answer
                    self._reply(status, data, [("Content-Type", "application/x-amz-json-1.1")])
                    return
                conn = http.client.HTTPConnection(proxy._host, proxy._port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                headers["Host"] = f"{proxy._host}:{proxy._port}"
                with proxy._forwarding(op, forwarded):
                    conn.request(self.command, self.path, body=proxy._outgoing(op, forwarded), headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                if unwritten and resp.status == 200:
                    data = merged(data, unwritten)
                data = proxy._transform(call, body, resp.status, data)
                conn.close()
                self._reply(resp.status, data, resp.getheaders())

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward

        return Handler

    @property
    def url(self) -> str:
        """``http://<host>:<port>`` of the proxy."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
