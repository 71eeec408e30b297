"""A canned Kinesis server that behaves like a remote service: fixed backlogs on several streams
and shards, served over HTTP keep-alive from a child process, with a fixed latency per request.

Why: moto serves ~6-7k records/s from one Python process on the client's cores, so through moto
every reader measures moto. This server pre-builds the JSON of every record once, so serving a
page is mostly a join, and runs on an asyncio server (``aiohttp.web``) in its own process, so its
CPU never holds the client's GIL. ``latency`` (seconds, ``await asyncio.sleep``: no CPU) is added
to every request to model a remote endpoint's round trip.

What it answers, in Kinesis' JSON protocol (``X-Amz-Target: Kinesis_20131202.<Op>``, content
type ``application/x-amz-json-1.1``): ``ListShards``, ``ListStreams``, ``DescribeStream``,
``DescribeStreamSummary``, ``GetShardIterator`` (``TRIM_HORIZON``, ``LATEST``,
``AT_SEQUENCE_NUMBER``, ``AFTER_SEQUENCE_NUMBER``, ``AT_TIMESTAMP``) and ``GetRecords``. Any other
operation gets a 400 ``UnknownOperationException`` naming it, so a missing one is obvious.

The backlog is deterministic. Record ``i`` of shard ``s`` has sequence number
``BASE_SEQ + i * SEQ_STRIDE + s`` (56 digits, increasing per shard, unique in the stream) and
arrived at ``created + (i + 1) * arrival_step_ms`` milliseconds; every shard holds the same
number of records and all are open.

A *live* stream (``StreamSpec.live_rate`` > 0) is fed while the server runs instead: record
``i`` of a fed shard arrives at ``origin + (i + 1) / live_rate`` seconds, where ``origin`` is when
the server built it (``CannedKinesisServer.origin``), and no read, iterator or
``MillisBehindLatest`` sees it before then; ``records_per_shard`` is how many can arrive before
the shard stops growing. With ``fed_every`` = k only every k-th shard (from the first) is fed,
the others stay empty: a stream with few active shards among many, without a writer process
and without a server whose CPU grows with the shard count. ``MillisBehindLatest`` of a page is the arrival time of the
shard's newest record less that of the page's last record (0 at the tip), as the tail probe
expects. Pages stop at 10,000 records or 10 MiB of data, as Kinesis' do. Iterators are opaque
base64 strings naming stream, shard and record index, and never expire.

``GET /canned/stats`` returns the requests served per operation since the last
``POST /canned/reset-stats`` (``CannedKinesisServer.stats()``), to count a reader's calls.

    with CannedKinesisServer([StreamSpec("s", shards=8, records_per_shard=4000, record_bytes=100)],
                             latency=0.02) as server:
        server.url  # http://127.0.0.1:<port>

    python -m benchmarks.canned [--shards 4] [--records 1000] [--bytes 100] [--latency 0.02]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import os
import random
import select
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

ACCOUNT = "123456789012"
REGION = "us-east-1"
TARGET_PREFIX = "Kinesis_20131202."
CONTENT_TYPE = "application/x-amz-json-1.1"
BASE_SEQ = 49590338271490256608559692538361571095921575989136588898
# Sequence numbers step by this per record, leaving room for the shard index in the low digits.
SEQ_STRIDE = 1_000_000
MAX_LIMIT = 10_000
MAX_PAGE_BYTES = 10 * 1024 * 1024
HASH_SPACE = 2**128
_READY_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class StreamSpec:
    """One stream of the canned server: ``shards`` shards of ``records_per_shard`` records of
    ``record_bytes`` bytes each."""

    name: str
    shards: int
    records_per_shard: int
    record_bytes: int
    live_rate: float = 0.0  # records a second per fed shard; 0: a backlog arrived at start
    fed_every: int = 1

    def fed(self, index: int) -> bool:
        """Whether the ``index``-th shard holds (or receives) records."""
        return index % self.fed_every == 0

    def shard_ids(self) -> list[str]:
        """Its shard ids, in order."""
        return [shard_id(i) for i in range(self.shards)]

    def per_shard(self) -> dict[str, int]:
        """Records per shard id (of a backlog; of a live stream, its capacity)."""
        return {s: self.records_per_shard if self.fed(i) else 0 for i, s in enumerate(self.shard_ids())}

    @property
    def records(self) -> int:
        """Records in the whole stream."""
        return sum(self.per_shard().values())

    def shard_bytes(self) -> int:
        """A fed shard's records' bytes as Kinesis' quotas count them: data and partition key."""
        return sum(self.record_bytes + len(partition_key(i)) for i in range(self.records_per_shard))

    def arrival(self, origin: float, seq: str) -> float:
        """When record ``seq`` of a live stream arrived (epoch seconds), ``origin`` being the
        server's :attr:`CannedKinesisServer.origin`."""
        index = (int(seq) - BASE_SEQ) // SEQ_STRIDE
        return origin + (index + 1) / self.live_rate


def shard_id(index: int) -> str:
    """Kinesis' shard id of the ``index``-th shard."""
    return f"shardId-{index:012d}"


def partition_key(index: int) -> str:
    """The partition key of record ``index`` of a shard."""
    return f"pk-{index}"


def seq_of(shard: int, index: int) -> int:
    """The sequence number of record ``index`` of shard ``shard``."""
    return BASE_SEQ + index * SEQ_STRIDE + shard


class KinesisError(Exception):
    """An error answered as Kinesis does: 400 and ``{"__type": code, "message": ...}``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# -- the server side (runs in the child process) -------------------------------------------


class _Shard:
    def __init__(self, stream: str, index: int, count: int, size: int, created_ms: float,
                 step_ms: float, live: bool = False) -> None:
        self.index = index
        self.id = shard_id(index)
        self.count = count
        self.live = live
        # arrival time (ms) of record i: created + (i + 1) * step
        self.first_ms = created_ms + step_ms
        self.step_ms = step_ms
        rng = random.Random(f"{stream}/{self.id}")
        filler = rng.randbytes(size)
        records = []
        for i in range(count):
            head = f"{stream}/{self.id}/{i}/".encode()
            data = base64.b64encode((head + filler)[:size]).decode()
            arrival = (self.first_ms + i * step_ms) / 1000
            records.append(
                f'{{"SequenceNumber":"{seq_of(index, i)}","ApproximateArrivalTimestamp":'
                f'{arrival:.3f},"Data":"{data}","PartitionKey":"{partition_key(i)}"}}'.encode()
            )
        self.records = records
        # Records per page within Kinesis' 10 MiB cap (the data is what counts).
        self.page_cap = max(1, min(MAX_LIMIT, MAX_PAGE_BYTES // max(1, size)))

    def arrival_ms(self, i: int) -> float:
        return self.first_ms + i * self.step_ms

    def arrived(self) -> int:
        """How many records have arrived (a backlog's all; a live shard's by the clock)."""
        if not self.live:
            return self.count
        return max(0, min(self.count, math.floor((time.time() * 1000 - self.first_ms) / self.step_ms) + 1))

    def index_of(self, seq_text: Any) -> int:
        """The record index of a sequence number of this shard (one that has arrived)."""
        try:
            offset = int(seq_text) - BASE_SEQ - self.index
        except (TypeError, ValueError):
            offset = -1
        if offset < 0 or offset % SEQ_STRIDE or offset // SEQ_STRIDE >= self.arrived():
            raise KinesisError(
                "InvalidArgumentException",
                f"StartingSequenceNumber {seq_text} used in GetShardIterator on shard {self.id} "
                "is not valid for this shard",
            )
        return offset // SEQ_STRIDE

    def index_at(self, epoch_seconds: float) -> int:
        """The first record that arrived at or after ``epoch_seconds``."""
        ms = epoch_seconds * 1000
        if ms <= self.first_ms:
            return 0
        return min(self.count, math.ceil((ms - self.first_ms) / self.step_ms))

    def hash_range(self, shards: int) -> dict[str, str]:
        width = HASH_SPACE // shards
        start = self.index * width
        end = HASH_SPACE - 1 if self.index == shards - 1 else start + width - 1
        return {"StartingHashKey": str(start), "EndingHashKey": str(end)}


class _Stream:
    def __init__(self, spec: StreamSpec, created_ms: float, step_ms: float, origin_ms: float) -> None:
        self.spec = spec
        self.name = spec.name
        self.arn = f"arn:aws:kinesis:{REGION}:{ACCOUNT}:stream/{spec.name}"
        live = spec.live_rate > 0
        if live:
            created_ms, step_ms = origin_ms, 1000 / spec.live_rate
        self.created = created_ms / 1000
        self.shards = [
            _Shard(spec.name, i, spec.records_per_shard if spec.fed(i) else 0, spec.record_bytes,
                   created_ms, step_ms, live)
            for i in range(spec.shards)
        ]
        self.by_id = {s.id: s for s in self.shards}

    def shard_json(self, s: _Shard) -> dict[str, Any]:
        return {
            "ShardId": s.id,
            "HashKeyRange": s.hash_range(len(self.shards)),
            "SequenceNumberRange": {"StartingSequenceNumber": str(seq_of(s.index, 0))},
        }

    def shard(self, sid: Any) -> _Shard:
        shard = self.by_id.get(sid)
        if shard is None:
            raise KinesisError(
                "ResourceNotFoundException",
                f"Could not find shard {sid} in stream {self.name} under account {ACCOUNT}.",
            )
        return shard


def _timestamp(value: Any) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        pass
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise KinesisError(
            "InvalidArgumentException", f"Timestamp {value!r} is not valid"
        ) from None


def _b64(obj: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj, separators=(",", ":")).encode()).decode()


def _unb64(text: Any, what: str) -> Any:
    try:
        return json.loads(base64.urlsafe_b64decode(str(text).encode()))
    except (ValueError, TypeError):
        raise KinesisError("InvalidArgumentException", f"{what} {text!r} is not valid") from None


class CannedBackend:
    """The request logic: ``answer(op, request) -> body bytes`` (no HTTP)."""

    def __init__(self, specs: list[StreamSpec], arrival_step_ms: int = 1) -> None:
        # The newest record of every backlog arrived when the server started; live streams
        # begin to fill then.
        self.origin = time.time()
        longest = max((s.records_per_shard for s in specs if not s.live_rate), default=0)
        created_ms = int(self.origin * 1000) - (longest + 1) * arrival_step_ms
        self.streams = {s.name: _Stream(s, created_ms, arrival_step_ms, self.origin * 1000) for s in specs}
        self.calls: dict[str, int] = {}

    def _stream(self, req: dict[str, Any]) -> _Stream:
        name = req.get("StreamName")
        if name is None and req.get("StreamARN"):
            name = str(req["StreamARN"]).rpartition("/")[2]
        stream = self.streams.get(name)  # type: ignore[arg-type]
        if stream is None:
            raise KinesisError(
                "ResourceNotFoundException",
                f"Stream {name} under account {ACCOUNT} not found.",
            )
        return stream

    def answer(self, op: str, req: dict[str, Any]) -> bytes:
        """The JSON body of one request, or :class:`KinesisError`."""
        self.calls[op] = self.calls.get(op, 0) + 1
        if op == "GetRecords":
            return self.get_records(req)
        handler = getattr(self, "op_" + op, None)
        if handler is None:
            raise KinesisError(
                "UnknownOperationException",
                f"The canned Kinesis server (benchmarks/canned.py) does not implement {op!r}",
            )
        return json.dumps(handler(req), separators=(",", ":")).encode()

    def get_records(self, req: dict[str, Any]) -> bytes:
        """``GetRecords``: a slice of the pre-built records joined, and the next iterator."""
        name, sid, first = _unb64(req.get("ShardIterator"), "ShardIterator")
        limit = req.get("Limit", MAX_LIMIT)
        if not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
            raise KinesisError(
                "InvalidArgumentException",
                f"1 validation error detected: Value '{limit}' at 'limit' failed to satisfy "
                f"constraint: Member must have value between 1 and {MAX_LIMIT}",
            )
        shard = self._stream({"StreamName": name}).shard(sid)
        arrived = shard.arrived()
        last = max(first, min(arrived, first + limit, first + shard.page_cap))
        behind = 0 if last >= arrived or last == first else round(
            shard.arrival_ms(arrived - 1) - shard.arrival_ms(last - 1))
        return b"".join((
            b'{"Records":[', b",".join(shard.records[first:last]),
            b'],"NextShardIterator":"', _b64([name, sid, last]).encode(),
            b'","MillisBehindLatest":', str(behind).encode(), b"}",
        ))

    def op_GetShardIterator(self, req: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        stream = self._stream(req)
        shard = stream.shard(req.get("ShardId"))
        kind = req.get("ShardIteratorType")
        if kind == "TRIM_HORIZON":
            index = 0
        elif kind == "LATEST":
            index = shard.arrived()
        elif kind == "AT_SEQUENCE_NUMBER":
            index = shard.index_of(req.get("StartingSequenceNumber"))
        elif kind == "AFTER_SEQUENCE_NUMBER":
            index = shard.index_of(req.get("StartingSequenceNumber")) + 1
        elif kind == "AT_TIMESTAMP":
            if "Timestamp" not in req:
                raise KinesisError("InvalidArgumentException",
                                   "Timestamp is required for AT_TIMESTAMP iterators")
            index = shard.index_at(_timestamp(req["Timestamp"]))
        else:
            raise KinesisError("InvalidArgumentException",
                               f"ShardIteratorType {kind!r} is not supported")
        return {"ShardIterator": _b64([stream.name, shard.id, index])}

    def op_ListShards(self, req: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        if req.get("NextToken"):
            name, start = _unb64(req["NextToken"], "NextToken")
            stream = self._stream({"StreamName": name})
        else:
            stream = self._stream(req)
            start = 0
            after = req.get("ExclusiveStartShardId")
            if after:
                start = sum(1 for s in stream.shards if s.id <= after)
        size = req.get("MaxResults") or 1000
        chunk = stream.shards[start:start + size]
        out: dict[str, Any] = {"Shards": [stream.shard_json(s) for s in chunk]}
        if start + size < len(stream.shards):
            out["NextToken"] = _b64([stream.name, start + size])
        return out

    def _summary(self, stream: _Stream) -> dict[str, Any]:
        return {
            "StreamName": stream.name,
            "StreamARN": stream.arn,
            "StreamStatus": "ACTIVE",
            "StreamModeDetails": {"StreamMode": "PROVISIONED"},
            "RetentionPeriodHours": 24,
            "StreamCreationTimestamp": stream.created,
            "EnhancedMonitoring": [{"ShardLevelMetrics": []}],
            "EncryptionType": "NONE",
        }

    def op_DescribeStreamSummary(self, req: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        stream = self._stream(req)
        summary = self._summary(stream)
        summary.update(OpenShardCount=len(stream.shards), ConsumerCount=0)
        return {"StreamDescriptionSummary": summary}

    def op_DescribeStream(self, req: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        stream = self._stream(req)
        after = req.get("ExclusiveStartShardId")
        shards = [s for s in stream.shards if not after or s.id > after]
        limit = req.get("Limit") or 100
        desc = self._summary(stream)
        desc.update(Shards=[stream.shard_json(s) for s in shards[:limit]],
                    HasMoreShards=len(shards) > limit)
        return {"StreamDescription": desc}

    def op_ListStreams(self, req: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        names = sorted(self.streams)
        return {
            "StreamNames": names,
            "HasMoreStreams": False,
            "StreamSummaries": [
                {"StreamName": n, "StreamARN": self.streams[n].arn, "StreamStatus": "ACTIVE",
                 "StreamModeDetails": {"StreamMode": "PROVISIONED"},
                 "StreamCreationTimestamp": self.streams[n].created}
                for n in names
            ],
        }


def serve(specs: list[StreamSpec], latency: float, arrival_step_ms: int = 1) -> None:
    """Build the backlog, listen on a free 127.0.0.1 port, print it, serve until killed (or
    until the parent process is gone)."""
    import logging
    import socket

    from aiohttp import web

    # A client that goes away mid-request (a Spark task stopped with its query) is no news.
    logging.getLogger("aiohttp").setLevel(logging.CRITICAL)

    backend = CannedBackend(specs, arrival_step_ms)
    headers = {"Content-Type": CONTENT_TYPE}
    counter = {"n": 0}

    def reply(status: int, body: bytes) -> web.Response:
        counter["n"] += 1
        return web.Response(status=status, body=body,
                            headers={**headers, "x-amzn-RequestId": f"canned-{counter['n']}"})

    async def handle(request: web.Request) -> web.Response:
        target = request.headers.get("X-Amz-Target", "")
        body = await request.read()
        if latency > 0:
            await asyncio.sleep(latency)
        op = target[len(TARGET_PREFIX):] if target.startswith(TARGET_PREFIX) else target
        try:
            if not target.startswith(TARGET_PREFIX):
                raise KinesisError("UnknownOperationException",
                                   f"X-Amz-Target {target!r} is not a Kinesis_20131202 operation")
            try:
                req = json.loads(body or b"{}")
            except ValueError:
                raise KinesisError(
                    "SerializationException", "the request body is not JSON"
                ) from None
            return reply(200, backend.answer(op, req))
        except KinesisError as exc:
            return reply(400, json.dumps({"__type": exc.code, "message": exc.message}).encode())

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(backend.calls)

    async def reset_stats(request: web.Request) -> web.Response:
        backend.calls.clear()
        return web.json_response({})

    async def main() -> None:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_get("/canned/stats", stats)
        app.router.add_post("/canned/reset-stats", reset_stats)
        app.router.add_post("/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None, keepalive_timeout=75.0)
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(runner, sock, backlog=256).start()
        print(json.dumps({"port": sock.getsockname()[1], "origin": backend.origin}), flush=True)
        parent = os.getppid()
        while os.getppid() == parent:  # the parent died: stop
            await asyncio.sleep(1.0)

    asyncio.run(main())


# -- the client side ------------------------------------------------------------------------


class CannedKinesisServer:
    """The canned server in a child process; ``with CannedKinesisServer(specs, latency) as s``."""

    def __init__(self, streams: list[StreamSpec], latency: float = 0.0,
                 arrival_step_ms: int = 1) -> None:
        self.streams = {s.name: s for s in streams}
        self.latency = latency
        self.arrival_step_ms = arrival_step_ms
        self.port: int | None = None
        # when the server built its streams: live streams' records arrive from then on
        self.origin = 0.0
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        if self.port is None:
            raise RuntimeError("the canned Kinesis server is not started")
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> CannedKinesisServer:
        """Start the child and wait until it has built the backlog and listens."""
        config = json.dumps({"streams": [asdict(s) for s in self.streams.values()],
                             "latency": self.latency, "arrival_step_ms": self.arrival_step_ms})
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.canned", "--serve", config],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
        )
        assert self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], _READY_TIMEOUT_S)
        line = self._proc.stdout.readline() if ready else b""
        if not line:
            self.stop()
            raise RuntimeError("the canned Kinesis server did not start")
        ready_line = json.loads(line)
        self.port, self.origin = int(ready_line["port"]), float(ready_line["origin"])
        return self

    def stop(self) -> None:
        """Stop the child (and wait for it)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def stats(self) -> dict[str, int]:
        """Requests served per operation since the last :meth:`reset_stats`."""
        with urllib.request.urlopen(f"{self.url}/canned/stats", timeout=10) as resp:
            return json.loads(resp.read())

    def reset_stats(self) -> None:
        """Start counting requests from zero."""
        req = urllib.request.Request(f"{self.url}/canned/reset-stats", data=b"", method="POST")
        urllib.request.urlopen(req, timeout=10).close()

    def __enter__(self) -> CannedKinesisServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _smoke(shards: int, records: int, size: int, latency: float) -> None:
    """Read every shard with boto3 and with kinesis-ddb's ``RangeReader``; print rates."""
    import boto3

    from benchmarks.common import settings
    from kinesis_source.aws.clients import shared_client
    from kinesis_source.executor.polling import RangeReader
    from kinesis_source.positions import Position, ShardRange

    spec = StreamSpec("smoke", shards, records, size)
    with CannedKinesisServer([spec], latency) as server:
        client = boto3.client("kinesis", endpoint_url=server.url, region_name=REGION,
                              aws_access_key_id="local", aws_secret_access_key="local")
        listed = client.list_shards(StreamName="smoke")["Shards"]
        print(f"{server.url}: {len(listed)} shards; first {listed[0]}")
        began, got = time.perf_counter(), 0
        for shard in spec.shard_ids():
            it = client.get_shard_iterator(StreamName="smoke", ShardId=shard,
                                           ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
            while True:
                page = client.get_records(ShardIterator=it, Limit=MAX_LIMIT)
                got += len(page["Records"])
                it = page["NextShardIterator"]
                if page["MillisBehindLatest"] == 0:
                    break
        took = time.perf_counter() - began
        print(f"boto3: {got} records in {took:.2f} s ({got / took:,.0f} rec/s)")
        kclient = shared_client(settings(server.url), "kinesis")
        began, got = time.perf_counter(), 0
        for i, shard in enumerate(spec.shard_ids()):
            rng = ShardRange("smoke", shard, Position.trim_horizon(), str(seq_of(i, records - 1)))
            got += sum(len(p) for p in RangeReader(kclient, rng, MAX_LIMIT).pages())
        took = time.perf_counter() - began
        print(f"RangeReader: {got} records in {took:.2f} s ({got / took:,.0f} rec/s)")
        print(f"calls: {server.stats()}")


def main() -> None:
    """Command-line entry point: a smoke read (``--serve CONFIG`` is the child)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", metavar="CONFIG_JSON")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--records", type=int, default=1000, help="records per shard")
    parser.add_argument("--bytes", type=int, default=100)
    parser.add_argument("--latency", type=float, default=0.02)
    args = parser.parse_args()
    if args.serve:
        config = json.loads(args.serve)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        serve([StreamSpec(**s) for s in config["streams"]], float(config["latency"]),
              int(config.get("arrival_step_ms", 1)))
        return
    _smoke(args.shards, args.records, args.bytes, args.latency)


if __name__ == "__main__":
    main()
