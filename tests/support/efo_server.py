"""A test server for enhanced fan-out: SubscribeToShard over AWS event-stream framing.

``EfoServer`` sits in front of a backing Kinesis endpoint (moto server or kinesis-local) and
forwards every request there, except:

- ``SubscribeToShard``, served here: the records come from ``GetShardIterator``/``GetRecords`` on
  the backing endpoint and are pushed as ``SubscribeToShardEvent`` messages in the
  ``application/vnd.amazon.eventstream`` framing that botocore parses;
- the consumer API (``RegisterStreamConsumer``, ``DescribeStreamConsumer``,
  ``ListStreamConsumers``, ``DeregisterStreamConsumer``), served here unless
  ``serve_consumers=False``: moto's consumers are ACTIVE at once, allow duplicate names and its
  deregister-by-name keeps the wrong consumers, so a consumer here goes CREATING -> ACTIVE after
  ``activation_delay_s``, names are unique per stream and there is a consumer limit.

Knobs that make it behave like Kinesis does over a long run:

- ``end_after_events`` / ``end_after_seconds``: end every subscription after that many events or
  that long (Kinesis ends each one after 5 minutes), so a reader must resubscribe;
- ``inject_error(code, after_events, times)``: send an exception event mid-subscription;
  ``drop_connection(after_events, times)``: cut the connection mid-subscription;
  ``stall(after_events, seconds, times)``: go silent mid-subscription, the connection open;
- ``child_shards_on_end`` / ``end_behind_ms``: how a closed shard's last event looks (its
  continuation is null in every case, and never null before);
- ``update_streams(seconds)``: streams are UPDATING for a while (RegisterStreamConsumer refused
  with ``ResourceInUseException``, as Kinesis does during a reshard);
- ``refuse_deregistering_creating``: a CREATING consumer refuses ``DeregisterStreamConsumer``
  with ``ResourceInUseException`` (AWS does not say whether Kinesis does; a reader must cope);
- ``chunk_bytes``: HTTP chunks of that size, cutting across event-stream messages;
- ``poll_interval_s``: how often a subscription with nothing new looks at the backend again;
  a write sent through this server wakes every subscription at once;
- ``in_use_window_s`` (5 s, as Kinesis): a second SubscribeToShard of one consumer and shard
  within that window of the previous successful one is refused with ``ResourceInUseException``;
  after it, the new subscription takes over and the old one gets a ``ResourceInUseException``
  event. ``min_call_gap_s`` (1 s, as Kinesis): a call within that time of the previous call of
  the same consumer and shard, refused or not, gets ``LimitExceededException``. ``refused``
  counts both.

``subscriptions`` counts successful SubscribeToShard calls; ``calls`` counts every operation;
``injected`` the faults that happened, by kind.
Listens on 127.0.0.1 (or a multi-host test's own bridge address, ``host``).
"""

from __future__ import annotations

import base64
import binascii
import http.client
import json
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlparse

from botocore.exceptions import ClientError

from kinesis_source.aws.clients import AwsSettings
from tests.support.http_server import LocalHTTPServer

SUBSCRIBE = "SubscribeToShard"
CONSUMER_OPS = {
    "RegisterStreamConsumer",
    "DescribeStreamConsumer",
    "ListStreamConsumers",
    "DeregisterStreamConsumer",
}
JSON_TYPE = "application/x-amz-json-1.1"

# -- the event-stream encoder --------------------------------------------------------------
# Message: prelude (total length, headers length: uint32 each, then the CRC32 of those 8 bytes),
# headers, payload, and the CRC32 of everything before it. A header is a 1-byte name length, the
# name, a 1-byte value type and the value.

_BOOL_TRUE, _BOOL_FALSE, _INT32, _INT64, _BYTES, _STRING = 0, 1, 4, 5, 6, 7


def _crc(data: bytes, start: int = 0) -> int:
    return binascii.crc32(data, start) & 0xFFFFFFFF


def encode_headers(headers: dict[str, Any]) -> bytes:
    """Headers in event-stream form: str, bytes, bool and int (int32, else int64) values."""
    out = bytearray()
    for name, value in headers.items():
        raw_name = name.encode()
        out += struct.pack("!B", len(raw_name)) + raw_name
        if isinstance(value, bool):
            out += struct.pack("!B", _BOOL_TRUE if value else _BOOL_FALSE)
        elif isinstance(value, int):
            if -(2**31) <= value < 2**31:
                out += struct.pack("!Bi", _INT32, value)
            else:
                out += struct.pack("!Bq", _INT64, value)
        else:
            raw = value if isinstance(value, bytes) else str(value).encode()
            out += struct.pack("!BH", _BYTES if isinstance(value, bytes) else _STRING, len(raw))
            out += raw
    return bytes(out)


def encode_message(headers: dict[str, Any], payload: bytes) -> bytes:
    """One complete event-stream message."""
    raw_headers = encode_headers(headers)
    total = 12 + len(raw_headers) + len(payload) + 4
    prelude = struct.pack("!II", total, len(raw_headers))
    prelude += struct.pack("!I", _crc(prelude))
    body = prelude + raw_headers + payload
    return body + struct.pack("!I", _crc(body))


def encode_event(event_type: str, body: dict) -> bytes:
    """An ``event`` message with a JSON payload."""
    headers = {
        ":message-type": "event",
        ":event-type": event_type,
        ":content-type": "application/json",
    }
    return encode_message(headers, json.dumps(body).encode())


def encode_exception(code: str, message: str) -> bytes:
    """An ``exception`` message (a modeled error of the event stream, e.g.
    ``InternalFailureException``)."""
    headers = {
        ":message-type": "exception",
        ":exception-type": code,
        ":content-type": "application/json",
    }
    return encode_message(headers, json.dumps({"message": message}).encode())


# -- the server ----------------------------------------------------------------------------


_DROP = "(drop the connection)"
_STALL = "(stall)"


class RawEvents:
    """Encoded event-stream bytes as the raw HTTP body botocore's ``EventStream`` reads (for
    decoding them in a unit test, without a connection)."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def stream(self):
        yield self._data

    def close(self):
        pass


class _Dropped(Exception):
    """Ends a subscription's connection without ending its HTTP body."""


class _ApiError(Exception):
    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


@dataclass
class _Consumer:
    name: str
    arn: str
    stream_arn: str
    created: float
    active_at: float
    deleting_until: float | None = None

    def status(self, now: float) -> str:
        if self.deleting_until is not None:
            return "DELETING"
        return "ACTIVE" if now >= self.active_at else "CREATING"

    def to_api(self, now: float, with_stream: bool = False) -> dict:
        out = {
            "ConsumerName": self.name,
            "ConsumerARN": self.arn,
            "ConsumerStatus": self.status(now),
            "ConsumerCreationTimestamp": self.created,
        }
        if with_stream:
            out["StreamARN"] = self.stream_arn
        return out


@dataclass
class _Subscription:
    consumer_arn: str
    shard_id: str
    started: float
    taken_over: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class SubscribeCall:
    """One successful SubscribeToShard: consumer, shard and starting position asked for."""

    consumer_arn: str
    shard_id: str
    starting_position: dict


def _stream_name(arn: str) -> str:
    """``arn:aws:kinesis:<region>:<account>:stream/<name>[/consumer/...]`` -> ``<name>``."""
    _, sep, rest = arn.partition(":stream/")
    if not sep or not rest:
        raise _ApiError("InvalidArgumentException", f"{arn!r} is not a Kinesis stream ARN")
    return rest.split("/")[0]


class EfoServer:
    """``with EfoServer(backing_url) as server: server.url``."""

    def __init__(
        self,
        backing_url: str,
        region: str = "us-east-1",
        serve_consumers: bool = True,
        activation_delay_s: float = 0.3,
        deletion_delay_s: float = 0.2,
        consumer_limit: int = 20,
        page_limit: int = 100,
        poll_interval_s: float = 0.05,
        heartbeat_s: float = 0.5,
        host: str = "127.0.0.1",
    ) -> None:
        target = urlparse(backing_url)
        self._host, self._port = target.hostname, target.port
        self.serve_consumers = serve_consumers
        self.activation_delay_s = activation_delay_s
        self.deletion_delay_s = deletion_delay_s
        self.consumer_limit = consumer_limit
        self.page_limit = page_limit
        self.poll_interval_s = poll_interval_s
        self.heartbeat_s = heartbeat_s
        self.end_after_events: int | None = None
        self.end_after_seconds: float = 300.0
        self.in_use_window_s = 5.0
        self.min_call_gap_s = 1.0  # Kinesis: 1 SubscribeToShard per second per consumer and shard
        self.refused = {"ResourceInUseException": 0, "LimitExceededException": 0}
        self.stall_s = 10.0
        # The end of a shard as Kinesis may send it: a null continuation, ChildShards empty or
        # left out, any MillisBehindLatest (a reader must not need more than the null).
        self.child_shards_on_end = True
        self.end_behind_ms = 0
        self.updating_until = 0.0  # time.time() until which every stream is UPDATING
        self.chunk_bytes: int | None = None  # HTTP chunks of this size, cutting across messages
        # Whether a CREATING consumer refuses DeregisterStreamConsumer (not documented by AWS).
        self.refuse_deregistering_creating = False
        self.subscribe_calls: list[SubscribeCall] = []
        # every SubscribeToShard that reached the per-shard rules: (monotonic arrival, shard,
        # the caller's SDK from its User-Agent, "ok" or the refusal's code), for failure messages
        self.attempts: list[tuple[float, str, str, str]] = []
        # records pushed to subscribers, and their data bytes (what fan-out's retrieval bills)
        self.sent_records = self.sent_bytes = 0
        self.calls: dict[str, int] = {}
        self._errors: list[list[Any]] = []  # [code, after_events, times left]
        self.injected: dict[str, int] = {}  # faults that happened, by code (or drop/stall)
        self._consumers: dict[str, _Consumer] = {}  # by ARN
        self._live: dict[tuple[str, str], _Subscription] = {}
        self._last_subscribe: dict[tuple[str, str], float] = {}
        self._last_call: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        # Writes forwarded through this server (PutRecord(s)) wake their shards' subscriptions at
        # once; writes that go to the backend directly are found by polling every poll_interval_s.
        self._written = threading.Condition()
        self._writes: dict[tuple[str, str], int] = {}  # by (stream, shard)
        self._stopping = threading.Event()
        self._backing = AwsSettings(
            region=region,
            endpoint_url=backing_url,
            access_key_id="local",
            secret_key="local",
            max_retries=3,
        ).boto3_client("kinesis")
        self._server = LocalHTTPServer((host, 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    # -- knobs and counters ----------------------------------------------------------------

    @property
    def subscriptions(self) -> int:
        """How many SubscribeToShard calls succeeded."""
        with self._lock:
            return len(self.subscribe_calls)

    def timeline(self) -> str:
        """Every SubscribeToShard attempt, a line each: seconds since the first, shard, caller
        and outcome (for a failing test's message)."""
        with self._lock:
            attempts = list(self.attempts)
        t0 = attempts[0][0] if attempts else 0.0
        return "\n".join(f"{t - t0:8.3f} {shard} {caller} {outcome}" for t, shard, caller, outcome in attempts)

    def inject_error(
        self, code: str = "InternalFailureException", after_events: int = 1, times: int = 1
    ) -> None:
        """The next ``times`` subscriptions that reach ``after_events`` record events send an
        exception event ``code`` instead of going on, then end."""
        with self._lock:
            self._errors.append([code, after_events, times])

    def drop_connection(self, after_events: int = 1, times: int = 1) -> None:
        """The next ``times`` subscriptions that reach ``after_events`` record events lose their
        connection abruptly (no end of the HTTP body), as a network reset does."""
        self.inject_error(_DROP, after_events, times)

    def stall(self, after_events: int = 1, seconds: float = 10.0, times: int = 1) -> None:
        """The next ``times`` subscriptions that reach ``after_events`` record events go silent
        for ``seconds`` (the connection open, nothing sent, not even empty events), then end."""
        self.stall_s = seconds
        self.inject_error(_STALL, after_events, times)

    def update_streams(self, seconds: float) -> None:
        """Streams are UPDATING for ``seconds`` (as during a reshard): ``DescribeStreamSummary``
        says so, and ``RegisterStreamConsumer`` is refused with ``ResourceInUseException``."""
        self.updating_until = time.time() + seconds

    def _updating(self) -> bool:
        return time.time() < self.updating_until

    def live_subscriptions(self) -> int:
        """Subscriptions currently pushing events."""
        with self._lock:
            return len(self._live)

    def _count(self, op: str) -> None:
        with self._lock:
            self.calls[op] = self.calls.get(op, 0) + 1

    def _take_error(self, events: int) -> str | None:
        with self._lock:
            for rule in self._errors:
                code, after, left = rule
                if left > 0 and events >= after:
                    rule[2] -= 1
                    self.injected[code] = self.injected.get(code, 0) + 1
                    return code
        return None

    # -- consumers -------------------------------------------------------------------------

    def _consumer_op(self, op: str, req: dict) -> dict:
        now = time.time()
        with self._lock:
            self._reap(now)
        if op == "ListStreamConsumers":
            stream_arn = self._check_stream(req.get("StreamARN", ""))
            with self._lock:
                found = [c for c in self._consumers.values() if c.stream_arn == stream_arn]
            return {"Consumers": [c.to_api(now) for c in found]}
        if op == "RegisterStreamConsumer":
            stream_arn = self._check_stream(req.get("StreamARN", ""))
            name = req.get("ConsumerName", "")
            if self._updating():
                raise _ApiError("ResourceInUseException", f"Stream {stream_arn} is UPDATING")
            with self._lock:
                mine = [c for c in self._consumers.values() if c.stream_arn == stream_arn]
                if any(c.name == name for c in mine):
                    raise _ApiError("ResourceInUseException", f"Consumer {name} already exists")
                if len(mine) >= self.consumer_limit:
                    raise _ApiError(
                        "LimitExceededException",
                        f"Stream {stream_arn} already has {len(mine)} consumers (the limit)",
                    )
                arn = f"{stream_arn}/consumer/{name}:{int(now)}"
                consumer = _Consumer(name, arn, stream_arn, now, now + self.activation_delay_s)
                self._consumers[arn] = consumer
                return {"Consumer": consumer.to_api(now)}
        consumer = self._find_consumer(req)
        if op == "DescribeStreamConsumer":
            return {"ConsumerDescription": consumer.to_api(now, with_stream=True)}
        with self._lock:  # DeregisterStreamConsumer
            if self.refuse_deregistering_creating and consumer.status(now) == "CREATING":
                raise _ApiError("ResourceInUseException", f"Consumer {consumer.arn} is CREATING")
            if consumer.deleting_until is None:
                consumer.deleting_until = now + self.deletion_delay_s
        return {}

    def _reap(self, now: float) -> None:
        for arn, consumer in list(self._consumers.items()):
            if consumer.deleting_until is not None and consumer.deleting_until <= now:
                del self._consumers[arn]

    def _check_stream(self, stream_arn: str) -> str:
        try:
            self._backing.describe_stream_summary(StreamName=_stream_name(stream_arn))
        except ClientError as exc:
            err = exc.response["Error"]
            raise _ApiError(err["Code"], err.get("Message", "")) from exc
        return stream_arn

    def _find_consumer(self, req: dict) -> _Consumer:
        with self._lock:
            if req.get("ConsumerARN"):
                found = self._consumers.get(req["ConsumerARN"])
            else:
                key = (req.get("StreamARN"), req.get("ConsumerName"))
                found = next(
                    (c for c in self._consumers.values() if (c.stream_arn, c.name) == key), None
                )
        if found is None:
            what = req.get("ConsumerARN") or f"{req.get('ConsumerName')} of {req.get('StreamARN')}"
            raise _ApiError("ResourceNotFoundException", f"Consumer {what} not found")
        return found

    # -- subscriptions ---------------------------------------------------------------------

    def _open(self, req: dict, agent: str = "") -> tuple[_Subscription, str, str]:
        """Check a SubscribeToShard request; returns the subscription, stream and iterator."""
        arrived = time.monotonic()  # the in-use window runs between calls, not backend replies
        arn, shard_id = req.get("ConsumerARN", ""), req.get("ShardId", "")
        stream = _stream_name(arn)
        if self.serve_consumers:
            consumer = self._find_consumer({"ConsumerARN": arn})
            status = consumer.status(time.time())
            if status != "ACTIVE":
                raise _ApiError("ResourceInUseException", f"Consumer {arn} is {status}")
        start = req.get("StartingPosition") or {}
        args: dict[str, Any] = {"ShardIteratorType": start.get("Type")}
        if "SequenceNumber" in start:
            args["StartingSequenceNumber"] = start["SequenceNumber"]
        if "Timestamp" in start:
            args["Timestamp"] = datetime.fromtimestamp(float(start["Timestamp"]), tz=timezone.utc)
        try:
            iterator = self._backing.get_shard_iterator(StreamName=stream, ShardId=shard_id, **args)
        except ClientError as exc:
            err = exc.response["Error"]
            raise _ApiError(err["Code"], err.get("Message", "")) from exc
        key = (arn, shard_id)
        with self._lock:
            called, self._last_call[key] = self._last_call.get(key), arrived
            caller = agent.split(" ", 1)[0]
            if called is not None and arrived - called < self.min_call_gap_s:
                self.attempts.append((arrived, shard_id, caller, "LimitExceededException"))
                self.refused["LimitExceededException"] += 1
                raise _ApiError(
                    "LimitExceededException",
                    f"Rate exceeded for consumer {arn} and shard {shard_id}",
                )
            last = self._last_subscribe.get(key)
            if last is not None and arrived - last < self.in_use_window_s:
                self.attempts.append((arrived, shard_id, caller, "ResourceInUseException"))
                self.refused["ResourceInUseException"] += 1
                raise _ApiError(
                    "ResourceInUseException",
                    f"Another active subscription exists for consumer {arn} on shard {shard_id}",
                )
            previous = self._live.get(key)
            if previous is not None:
                previous.taken_over.set()
            sub = _Subscription(arn, shard_id, time.monotonic())
            self._live[key] = sub
            self._last_subscribe[key] = arrived
            self.subscribe_calls.append(SubscribeCall(arn, shard_id, dict(start)))
            self.attempts.append((arrived, shard_id, caller, "ok"))
        return sub, stream, iterator["ShardIterator"]

    def _close(self, sub: _Subscription) -> None:
        with self._lock:
            key = (sub.consumer_arn, sub.shard_id)
            if self._live.get(key) is sub:
                del self._live[key]

    def _events(self, sub: _Subscription, stream: str, iterator: str, start: dict):
        """The messages of one subscription, as encoded frames (ends when it should)."""
        yield encode_event("initial-response", {})
        # Kinesis puts a sequence number in every event of an open shard (null only at its end):
        # before any record, where the subscription started (or the shard's first number).
        continuation = start.get("SequenceNumber") or self._first_sequence_number(stream, sub.shard_id)
        events = 0
        last_sent = 0.0
        while True:
            if self._stopping.is_set():
                return
            if sub.taken_over.is_set():
                yield encode_exception(
                    "ResourceInUseException", f"Another subscription took over shard {sub.shard_id}"
                )
                return
            if time.monotonic() - sub.started >= self.end_after_seconds:
                return
            gone = self._consumer_gone(sub.consumer_arn)
            if gone is not None:  # deregistered while subscribed: Kinesis says so in the stream
                yield encode_exception("ResourceNotFoundException", gone)
                return
            if self.end_after_events is not None and events >= self.end_after_events:
                return
            code = self._take_error(events)
            if code == _DROP:
                raise _Dropped()
            if code == _STALL:
                self._stopping.wait(self.stall_s)  # silent, as a stalled subscription is
                return
            if code is not None:
                yield encode_exception(code, f"injected by the test EFO server: {code}")
                return
            seen = self._writes.get((stream, sub.shard_id), 0)
            resp = self._backing.get_records(ShardIterator=iterator, Limit=self.page_limit)
            records = resp.get("Records", [])
            behind = int(resp.get("MillisBehindLatest") or 0)
            iterator = resp.get("NextShardIterator")
            if records:
                continuation = records[-1]["SequenceNumber"]
            event: dict[str, Any] = {
                "Records": [_record_json(r) for r in records],
                "ContinuationSequenceNumber": continuation,
                "MillisBehindLatest": behind,
            }
            if iterator is None:  # the shard ended: say so, with its children, and stop
                if self.child_shards_on_end:
                    event["ChildShards"] = resp.get("ChildShards") or self._children(stream, sub.shard_id)
                else:
                    event["MillisBehindLatest"] = self.end_behind_ms
                event["ContinuationSequenceNumber"] = None
                with self._lock:
                    self.sent_records += len(records)
                    self.sent_bytes += sum(len(r["Data"]) for r in records)
                yield encode_event("SubscribeToShardEvent", event)
                return
            now = time.monotonic()
            if records or (behind == 0 and now - last_sent >= self.heartbeat_s):
                events += 1
                last_sent = now
                with self._lock:
                    self.sent_records += len(records)
                    self.sent_bytes += sum(len(r["Data"]) for r in records)
                yield encode_event("SubscribeToShardEvent", event)
            if not records and behind == 0:
                self._wait_for_write((stream, sub.shard_id), seen)

    def _wait_for_write(self, shard: tuple[str, str], seen: int) -> None:
        """Wait until a write to ``shard`` comes through this server after its ``seen``-th, or
        the poll interval passed."""
        with self._written:
            self._written.wait_for(lambda: self._writes.get(shard, 0) != seen, self.poll_interval_s)

    def _wrote(self, request: bytes, answer: bytes) -> None:
        """A write went through: wake the subscriptions of the shards it wrote to."""
        try:
            req, data = json.loads(request), json.loads(answer)
            stream = req["StreamName"] if req.get("StreamName") else _stream_name(req.get("StreamARN", ""))
        except (ValueError, KeyError, _ApiError):
            return
        shards = {r["ShardId"] for r in data.get("Records", []) if "ShardId" in r} or {data.get("ShardId")}
        with self._written:
            for shard in shards - {None}:
                self._writes[(stream, shard)] = self._writes.get((stream, shard), 0) + 1
            self._written.notify_all()

    def _consumer_gone(self, arn: str) -> str | None:
        """Why a subscription of consumer ``arn`` cannot go on (it is being deleted), or None."""
        if not self.serve_consumers:
            return None
        with self._lock:
            consumer = self._consumers.get(arn)
        if consumer is None or consumer.status(time.time()) != "ACTIVE":
            return f"Consumer {arn} not found"
        return None

    def _first_sequence_number(self, stream: str, shard_id: str) -> str:
        shards = self._backing.list_shards(StreamName=stream)["Shards"]
        found = next(s for s in shards if s["ShardId"] == shard_id)
        return found["SequenceNumberRange"]["StartingSequenceNumber"]

    def _children(self, stream: str, shard_id: str) -> list[dict]:
        shards = self._backing.list_shards(StreamName=stream).get("Shards", [])
        out = []
        for s in shards:
            parents = [p for p in (s.get("ParentShardId"), s.get("AdjacentParentShardId")) if p]
            if shard_id in parents:
                keys = s["HashKeyRange"]
                out.append({"ShardId": s["ShardId"], "ParentShards": parents, "HashKeyRange": keys})
        return out

    # -- HTTP ------------------------------------------------------------------------------

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

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

            def _json(self, status: int, body: dict) -> None:
                self._reply(status, json.dumps(body).encode(), [("Content-Type", JSON_TYPE)])

            def _error(self, err: _ApiError) -> None:
                self._json(err.status, {"__type": err.code, "message": err.message})

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                op = self.headers.get("X-Amz-Target", "").rpartition(".")[2] or self.command
                server._count(op)
                try:
                    if op == SUBSCRIBE:
                        return self._subscribe(json.loads(body or b"{}"))
                    if op in CONSUMER_OPS and server.serve_consumers:
                        return self._json(200, server._consumer_op(op, json.loads(body or b"{}")))
                except _ApiError as err:
                    return self._error(err)
                self._forward(body)

            def _forward(self, body: bytes) -> None:
                conn = http.client.HTTPConnection(server._host, server._port, timeout=60)
                skip = ("host", "content-length")
                headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
                headers["Host"] = f"{server._host}:{server._port}"
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                target = self.headers.get("X-Amz-Target", "")
                if resp.status == 200 and target.rpartition(".")[2] in ("PutRecord", "PutRecords"):
                    server._wrote(body, data)
                if resp.status == 200 and target.endswith(".DescribeStreamSummary") and server._updating():
                    summary = json.loads(data)
                    summary["StreamDescriptionSummary"]["StreamStatus"] = "UPDATING"
                    return self._json(200, summary)
                self._reply(resp.status, data, resp.getheaders())

            def _subscribe(self, req: dict) -> None:
                sub, stream, iterator = server._open(req, self.headers.get("User-Agent", ""))
                self.send_response(200)
                self.send_header("Content-Type", "application/vnd.amazon.eventstream")
                self.send_header("Transfer-Encoding", "chunked")
                # A subscription's connection is not reused: without this, the client pools it
                # and may send its next request on a socket this server is closing.
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                try:
                    # One HTTP chunk per message, flushed at once: botocore reads chunks as
                    # they come, so the reader sees every event without waiting for more. With
                    # ``chunk_bytes``, chunks of that size cut across messages instead: a message
                    # split over chunks, and a chunk holding the end of one message and the start
                    # of the next (a message's tail then waits for the next message).
                    start = req.get("StartingPosition") or {}
                    size, carry = server.chunk_bytes, b""
                    for frame in server._events(sub, stream, iterator, start):
                        data = carry + frame
                        cut = len(data) - len(data) % size if size else len(data)
                        carry = data[cut:]
                        for i in range(0, cut, size or cut or 1):
                            piece = data[i:i + (size or cut)]
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                        self.wfile.flush()
                    if carry:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(carry), carry))
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the reader closed its subscription
                except _Dropped:
                    self.connection.shutdown(socket.SHUT_RDWR)
                finally:
                    server._close(sub)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle

        return Handler

    @property
    def url(self) -> str:
        """``http://<host>:<port>`` of the server."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> EfoServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()


def _record_json(record: dict) -> dict:
    """A record parsed by our Kinesis client, back in its wire form (as GetRecords sends it)."""
    out = {
        "SequenceNumber": record["SequenceNumber"],
        "ApproximateArrivalTimestamp": record["ApproximateArrivalTimestamp"],
        "Data": base64.b64encode(record["Data"]).decode(),
        "PartitionKey": record["PartitionKey"],
    }
    if record.get("EncryptionType"):
        out["EncryptionType"] = record["EncryptionType"]
    return out
