"""A Kinesis test server that enforces real Kinesis' quotas, and counts every call per shard.

``QuotaProxy`` is a :class:`~tests.support.proxy.FaultProxy` (every fault rule still works) in
front of moto server or kinesis-local, which enforce no quota. It answers as AWS does once a
budget is spent:

- ``GetRecords``: at most 5 calls in any 1-second window per shard, all callers together, and
  2 MiB/s of data per shard from a 10 MiB bucket: a response may overdraw the bucket, and calls
  are refused while it is empty (so after a 10 MiB response, calls in the next 5 s are
  refused) -> ``ProvisionedThroughputExceededException``;
- ``GetShardIterator``: 5 calls per second per shard -> ``ProvisionedThroughputExceededException``;
- writes: 1,000 records and 1 MiB (data and partition keys) per second per shard, every writer
  together, each a bucket one second deep refilled continuously. ``PutRecords`` is judged record
  by record in the request's order: a record that does not fit both buckets is refused (its entry
  answers ``ProvisionedThroughputExceededException``) and spends nothing, the others are written;
  a ``PutRecord`` that does not fit is refused as a call. A record's shard is the open shard
  whose hash key range holds its explicit hash key, or else the MD5 of its partition key; the
  ranges come from the backend's ListShards, listed again when a key falls in none of them or
  the backend writes to a shard not listed (after a reshard);
- control-plane calls, per stream or per account as AWS counts them -> ``LimitExceededException``.

(``SubscribeToShard``'s 5-second rule lives in :mod:`tests.support.efo_server`, which serves
the subscriptions.)

A refused call (or record) does not spend the budget. The proxy learns which shard each iterator
belongs to from the answers it forwards, so every ``GetRecords`` is counted against its shard;
callers are told apart by access key id (one per application) and by client kind (``async``:
aiobotocore, the source's driver; ``sync``: boto3, its executors and most tools). Records written
and refused are kept per shard with their times (:meth:`QuotaProxy.written`,
:meth:`QuotaProxy.refused_records`, :meth:`QuotaProxy.peak_write_rate`).

:class:`Neighbour` is another application polling every shard, as the one the source shares the
quota with.

:class:`Feeder` writes records to chosen shards at a steady rate, so a stream has records
arriving over time as a producer's would.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.support.proxy import TRUNCATED, FaultProxy, Seen, _error, _request, _stream_of
from tests.support.put_records import THROTTLED, hash_key, record_bytes, record_error

LIMIT_EXCEEDED = "LimitExceededException"
NEIGHBOUR = "neighbour"  # the access key of the Neighbour application

# What the tests' query options set to plan fast: probes every 100 ms within Kinesis' whole
# per-shard quota. Tests of the call budget run without them, as users do.
FAST_PLANNING = {
    "minProbeIntervalMs": "100",
    "getRecordsPerShardPerSecond": "5",
    "getShardIteratorPerShardPerSecond": "5",
}


def as_users_run(options: dict[str, str]) -> dict[str, str]:
    """``options`` without :data:`FAST_PLANNING`: the planning and budget defaults."""
    return {k: v for k, v in options.items() if k not in FAST_PLANNING}
MIB = 1024 * 1024
WINDOW_S = 1.0


@dataclass(frozen=True)
class Quotas:
    """The budgets enforced (AWS' values by default)."""

    get_records_calls: int = 5  # per shard per second, every caller together
    get_records_bytes_per_s: int = 2 * MIB  # per shard
    get_records_burst_bytes: int = 10 * MIB  # the bucket a response may overdraw
    get_shard_iterator_calls: int = 5  # per shard per second
    # Writes per shard per second, every writer together (None: not enforced).
    put_records_per_shard: int | None = 1000
    put_bytes_per_shard: int | None = MIB  # data and partition keys
    # Control plane: (calls per second, counted per "stream" or per "account").
    control: tuple[tuple[str, int, str], ...] = (
        ("ListShards", 1000, "stream"),
        ("DescribeStreamSummary", 20, "account"),
        ("DescribeStream", 10, "account"),
        ("ListStreams", 5, "account"),
        ("RegisterStreamConsumer", 5, "account"),
        ("DescribeStreamConsumer", 20, "stream"),
        ("ListStreamConsumers", 5, "stream"),
        ("DeregisterStreamConsumer", 5, "account"),
    )


def _b64_length(data: str) -> int:
    """The length of what ``data`` (base64, as Kinesis' JSON sends it) decodes to, without
    decoding it: the proxy counts every answer's bytes, and decoding 10 MB pages on its thread
    took CPU from the processes it measures."""
    return len(data) // 4 * 3 - (2 if data.endswith("==") else 1 if data.endswith("=") else 0)


def _data_bytes(resp: dict[str, Any]) -> int:
    """What a GetRecords answer costs the shard's byte budget: data and partition keys."""
    total = 0
    for rec in resp.get("Records", []):
        data = rec.get("Data", "")
        total += _b64_length(data) if isinstance(data, str) else len(data)
        total += len(rec.get("PartitionKey", "").encode())
    return total


class _Bucket:
    """A shard's budget: refills at ``rate`` up to ``depth`` (a read response may overdraw it)."""

    def __init__(self, rate: float, depth: float, now: float) -> None:
        self.rate, self.depth = rate, depth
        self.tokens, self.at = depth, now

    def level(self, now: float) -> float:
        # Concurrent calls are judged in any order: an earlier arrival refills nothing.
        if now > self.at:
            self.tokens = min(self.depth, self.tokens + (now - self.at) * self.rate)
            self.at = now
        return self.tokens


class QuotaProxy(FaultProxy):
    """``with QuotaProxy(backend_url) as q: q.url``; see the module docstring."""

    def __init__(
        self, target_url: str, quotas: Quotas | None = None, seed: int = 7, count_records: bool = False,
        host: str = "127.0.0.1",
    ) -> None:
        super().__init__(target_url, seed=seed, host=host)
        self.quotas = quotas or Quotas()
        # with count_records: each record's reads, (call time, client kind), by
        # (access key, stream, shard, sequence number); off by default, it grows with the stream
        self.reads_of: dict[tuple[str | None, str, str, str], list[tuple[float, str | None]]] | None = (
            defaultdict(list) if count_records else None
        )
        self._windows: dict[tuple, deque[float]] = defaultdict(deque)
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self._iterators: dict[str, tuple[str, str]] = {}  # client-visible iterator -> shard
        self.bytes_read: dict[tuple[str, str], int] = defaultdict(int)
        # the same by caller: (access key, client kind, stream, shard)
        self.bytes_read_by: dict[tuple[str | None, str | None, str, str], int] = defaultdict(int)
        self._control = {op: (limit, per) for op, limit, per in self.quotas.control}
        self._put_buckets: dict[tuple[str, str], tuple[_Bucket | None, _Bucket | None]] = {}
        # (arrival time, bytes) of each record, per (stream, shard)
        self._put_written: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
        self._put_refused: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)

    # -- budgets -------------------------------------------------------------------------

    def _admit(self, key: tuple, limit: int, now: float) -> bool:
        """Spend one call of the window ``key`` unless ``limit`` calls were made in the last second."""
        window = self._windows[key]
        while window and window[0] <= now - WINDOW_S:
            window.popleft()
        if len(window) >= limit:
            return False
        window.append(now)
        return True

    def _bucket(self, shard: tuple[str, str], now: float) -> _Bucket:
        if shard not in self._buckets:
            q = self.quotas
            self._buckets[shard] = _Bucket(q.get_records_bytes_per_s, q.get_records_burst_bytes, now)
        return self._buckets[shard]

    def _writes_fit(self, shard: tuple[str, str], size: int, now: float) -> bool:
        """Spend one record of ``size`` bytes of the shard's write budget, if both buckets hold it;
        else count it refused. Called under the lock."""
        if shard not in self._put_buckets:
            rate, nbytes = self.quotas.put_records_per_shard, self.quotas.put_bytes_per_shard
            self._put_buckets[shard] = (
                _Bucket(rate, rate, now) if rate is not None else None,
                _Bucket(nbytes, nbytes, now) if nbytes is not None else None,
            )
        records, data = self._put_buckets[shard]
        if (records is not None and records.level(now) < 1) or (data is not None and data.level(now) < size):
            self._put_refused[shard].append((now, size))
            return False
        if records is not None:
            records.tokens -= 1
        if data is not None:
            data.tokens -= size
        return True

    def _refusal(self, call: Seen, req: dict[str, Any]) -> str | None:
        """The error code that refuses this call, or ``None`` (the call then spends its budget)."""
        op, shard, now, q = call.operation, call.shard, call.at, self.quotas
        with self._lock:
            if op == "GetRecords" and shard is not None:
                if self._bucket(shard, now).level(now) <= 0:
                    return THROTTLED
                return None if self._admit(("GetRecords", shard), q.get_records_calls, now) else THROTTLED
            if op == "GetShardIterator" and shard is not None:
                return None if self._admit((op, shard), q.get_shard_iterator_calls, now) else THROTTLED
            if op == "PutRecord" and shard is not None:
                return None if self._writes_fit(shard, record_bytes(req), now) else THROTTLED
            if op in self._control:
                limit, per = self._control[op]
                scope = _stream_of(req) if per == "stream" else "account"
                return None if self._admit((op, scope), limit, now) else LIMIT_EXCEEDED
        return None

    # -- the proxy's hooks ---------------------------------------------------------------

    def _shard_of(self, op: str, req: dict[str, Any]) -> tuple[str, str] | None:
        if op == "GetShardIterator":
            stream = _stream_of(req)
            return (stream, req["ShardId"]) if stream and req.get("ShardId") else None
        if op == "GetRecords":
            with self._lock:
                return self._iterators.get(req.get("ShardIterator", ""))
        if op == "PutRecord":
            stream = _stream_of(req)
            (shard,) = self._shards.shards(stream, [hash_key(req)])
            return (stream, shard) if stream and shard else None
        return None

    def _describe(self, call: Seen, body: bytes) -> Seen:
        return dataclasses.replace(call, shard=self._shard_of(call.operation, _request(body)))

    def _intercept(self, call: Seen, body: bytes) -> tuple[int, bytes] | None:
        refused = self._refusal(call, _request(body))
        if refused is not None:
            self._record(dataclasses.replace(call, injected=refused))
            if call.operation == "PutRecord" and call.shard is not None:
                return 400, _error(refused, record_error(refused, *call.shard)["ErrorMessage"])
            where = f" for shard {call.shard[1]} in stream {call.shard[0]}" if call.shard else ""
            return 400, _error(refused, f"Rate exceeded{where} (the test's quota server)")
        return super()._intercept(call, body)

    def _unwritten(self, call: Seen, body: bytes) -> dict[int, dict[str, str]]:
        unwritten = super()._unwritten(call, body)  # a fault rule's records spend no budget
        q = self.quotas
        if call.operation != "PutRecords" or (q.put_records_per_shard is None and q.put_bytes_per_shard is None):
            return unwritten
        req = _request(body)
        stream, records = _stream_of(req), req.get("Records") or []
        judged = [i for i in range(len(records)) if i not in unwritten]
        owners = self._shards.shards(stream, [hash_key(records[i]) for i in judged])
        with self._lock:
            for i, shard in zip(judged, owners, strict=True):
                # a record of no known shard (no such stream): the backend answers it
                if stream is not None and shard is not None:
                    if not self._writes_fit((stream, shard), record_bytes(records[i]), call.at):
                        unwritten[i] = record_error(THROTTLED, stream, shard)
        return unwritten

    def _count_writes(self, call: Seen, body: bytes, data: bytes) -> None:
        """Count the records the backend wrote, on the shards it names (a shard it names that was
        not listed makes the stream's shards listed again)."""
        req, resp = _request(body), json.loads(data)
        stream = _stream_of(req)
        if stream is None:
            return
        if call.operation == "PutRecords":
            pairs = list(zip(req.get("Records", []), resp.get("Records", []), strict=True))
        else:
            pairs = [(req, resp)]
        written = [(entry["ShardId"], record_bytes(record)) for record, entry in pairs if "SequenceNumber" in entry]
        with self._lock:
            for shard, size in written:
                self._put_written[(stream, shard)].append((call.at, size))
        for shard in {shard for shard, _ in written}:
            self._shards.written_to(stream, shard)

    def _transform(self, call: Seen, body: bytes, status: int, data: bytes) -> bytes:
        data = super()._transform(call, body, status, data)
        if status == 200 and call.operation in ("PutRecords", "PutRecord"):
            self._count_writes(call, body, data)
        if status != 200 or call.shard is None:
            return data
        resp = json.loads(data)
        with self._lock:
            if call.operation == "GetShardIterator" and resp.get("ShardIterator"):
                self._iterators[resp["ShardIterator"]] = call.shard
            elif call.operation == "GetRecords":
                if resp.get("NextShardIterator"):
                    self._iterators[resp["NextShardIterator"]] = call.shard
                spent = _data_bytes(resp)
                self.bytes_read[call.shard] += spent
                self.bytes_read_by[(call.access_key, call.client, *call.shard)] += spent
                if self.reads_of is not None:
                    for record in resp.get("Records", []):
                        self.reads_of[(call.access_key, *call.shard, record["SequenceNumber"])].append(
                            (call.at, call.client)
                        )
                bucket = self._bucket(call.shard, time.monotonic())
                bucket.level(time.monotonic())
                bucket.tokens -= spent
                self._charged(call, spent, len(resp.get("Records", [])))
        return data

    def _charged(self, call: Seen, spent: int, records: int) -> None:
        """A ``GetRecords`` answer of ``records`` records was charged ``spent`` bytes (under the
        lock): for subclasses that keep each answer, without parsing it again."""

    def _gap_page(self, op: str, body: bytes) -> tuple[int, bytes] | None:
        answer = super()._gap_page(op, body)
        if answer is not None:  # an answer made here: learn its iterator as _transform would
            nxt = json.loads(answer[1])["NextShardIterator"]
            with self._lock:
                shard = self._iterators.get(json.loads(body).get("ShardIterator", ""))
                if shard is not None:
                    self._iterators[nxt] = shard
        return answer

    # -- what happened -------------------------------------------------------------------

    def calls(
        self,
        op: str | None = None,
        *,
        where: Callable[[Seen], bool] | None = None,
        refused: bool | None = None,
    ) -> list[Seen]:
        """The calls (of ``op``; matching ``where``; refused by a quota or not) so far."""
        out = []
        for s in self.operations():
            if op is not None and s.operation != op:
                continue
            if refused is not None and (s.injected in (THROTTLED, LIMIT_EXCEEDED)) != refused:
                continue
            if where is not None and not where(s):
                continue
            out.append(s)
        return out

    def refused(self, where: Callable[[Seen], bool] | None = None) -> int:
        """How many calls a quota refused."""
        return len(self.calls(where=where, refused=True))

    def written(self, stream: str | None = None, shard: str | None = None) -> list[tuple[float, int]]:
        """``(time, bytes)`` of each record ``PutRecord(s)`` wrote (to that stream, that shard), in
        time order: the time its request came in, the bytes its shard's write quota counted."""
        return self._put_records(self._put_written, stream, shard)

    def refused_records(self, stream: str | None = None, shard: str | None = None) -> list[tuple[float, int]]:
        """``(time, bytes)`` of each record a write quota refused (a ``PutRecords`` entry, or a
        whole ``PutRecord``), as :meth:`written`."""
        return self._put_records(self._put_refused, stream, shard)

    def write_shards(self) -> list[tuple[str, str]]:
        """The ``(stream, shard)`` pairs written to or refused a write so far."""
        with self._lock:
            return sorted(set(self._put_written) | set(self._put_refused))

    def peak_write_rate(
        self,
        window_s: float = 1.0,
        *,
        unit: str = "records",
        stream: str | None = None,
        since: float | None = None,
    ) -> float:
        """The most records (``unit="bytes"``: bytes) written to any one shard (of ``stream``; since
        ``since``) in a ``window_s`` window, per second. The write quota keeps it at most its rate
        plus the bucket's depth (one second's worth) spread over the window."""
        best = 0
        for st, shard in self.write_shards():
            if stream is None or st == stream:
                points = [(t, 1 if unit == "records" else n) for t, n in self.written(st, shard)]
                best = max(best, _heaviest([p for p in points if since is None or p[0] >= since], window_s))
        return best / window_s

    def _put_records(
        self, table: dict[tuple[str, str], list[tuple[float, int]]], stream: str | None, shard: str | None
    ) -> list[tuple[float, int]]:
        with self._lock:
            return sorted(
                p for (st, sh), points in table.items()
                if (stream is None or st == stream) and (shard is None or sh == shard)
                for p in points
            )

    def unattributed(self) -> list[Seen]:
        """The ``GetRecords`` and ``GetShardIterator`` calls counted against no shard (an
        iterator this server never handed out, a request naming no stream). A request cut short by
        its client's death is not a call: it never reached a server."""
        return [
            s for s in self.calls()
            if s.operation in ("GetRecords", "GetShardIterator") and s.shard is None and s.injected != TRUNCATED
        ]

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        if exc[0] is None:  # every quota test checks it: each call was counted per shard
            stray = self.unattributed()
            assert not stray, f"{len(stray)} calls counted against no shard, e.g. {stray[:3]}"

    def peak_rate(
        self,
        op: str,
        window_s: float = 10.0,
        where: Callable[[Seen], bool] | None = None,
        since: float | None = None,
    ) -> float:
        """The most calls of ``op`` any one shard got in a ``window_s`` window, per second
        (refused calls included: they also cost the callers' neighbours)."""
        per_shard: dict[tuple[str, str], list[float]] = defaultdict(list)
        for s in self.calls(op, where=where):
            if s.shard is not None and (since is None or s.at >= since):
                per_shard[s.shard].append(s.at)
        return max((_densest(times, window_s) for times in per_shard.values()), default=0) / window_s


def _densest(times: list[float], window_s: float) -> int:
    """The most of ``times`` inside any half-open window of that length."""
    return _heaviest([(t, 1) for t in times], window_s)


def _heaviest(points: list[tuple[float, int]], window_s: float) -> int:
    """The largest sum of the weights of ``(time, weight)`` points inside any half-open window of
    that length."""
    points = sorted(points)
    best, lo, total = 0, 0, 0
    for t, weight in points:
        total += weight
        while points[lo][0] <= t - window_s:
            total -= points[lo][1]
            lo += 1
        best = max(best, total)
    return best


class Neighbour:
    """Another application: reads every shard's tip ``rate`` times a second (all shards each
    round; a shard's first call opens its LATEST iterator), without retries, so each refusal is
    seen; ``refused`` and ``calls`` count them (``errors``: other failed calls, such as moto's
    500 when a read races a write)."""

    def __init__(self, url: str, stream: str, shards: list[str], rate: float = 1.0) -> None:
        self._client = boto3.client(
            "kinesis", endpoint_url=url, region_name="us-east-1", aws_access_key_id=NEIGHBOUR,
            aws_secret_access_key="local", config=Config(retries={"total_max_attempts": 1}),
        )
        self._stream, self._shards, self._pause = stream, shards, 1.0 / rate
        self.refused = 0
        self.calls = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        its: dict[str, str] = {}
        while not self._stop.wait(self._pause):  # the neighbour's polling rate
            for shard in self._shards:
                self.calls += 1
                try:
                    if shard not in its:  # opened in the loop: a refused opening is tried again
                        its[shard] = self._client.get_shard_iterator(
                            StreamName=self._stream, ShardId=shard, ShardIteratorType="LATEST")["ShardIterator"]
                    else:
                        its[shard] = self._client.get_records(ShardIterator=its[shard])["NextShardIterator"]
                except ClientError as exc:
                    if exc.response["Error"]["Code"] == THROTTLED:
                        self.refused += 1
                    else:  # the backend's own failure (moto's reads race its writes): no refusal
                        self.errors += 1

    def __enter__(self) -> Neighbour:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


class Feeder:
    """Writes ``per_shard_rate`` rounds a second to each of ``shards`` (ids) of ``stream`` (a
    round: ``per_round`` records of ``size`` bytes per shard, one ``PutRecords``), straight to
    the backend, until stopped; ``sent`` holds ``(shard id, seq, data)``, ``put_at`` each
    sequence number's ``PutRecords`` call time (epoch seconds: the record arrived after it)."""

    def __init__(
        self, client: Any, stream: str, shards: Iterable[str], per_shard_rate: float, size: int = 100,
        per_round: int = 1,
    ):
        listed = client.list_shards(StreamName=stream)["Shards"]
        starts = {s["ShardId"]: s["HashKeyRange"]["StartingHashKey"] for s in listed}
        self._targets = [(shard, starts[shard]) for shard in shards for _ in range(per_round)]
        self._client, self._stream = client, stream
        self._rate, self._size = per_shard_rate, size
        self.sent: list[tuple[str, str, bytes]] = []
        self.put_at: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        started, n = time.monotonic(), 0
        while not self._stop.is_set():
            n += 1
            records = [
                {"Data": f"f-{shard}-{n}".ljust(self._size, ".").encode(), "PartitionKey": "k", "ExplicitHashKey": key}
                for shard, key in self._targets
            ]
            called = time.time()
            resp = self._client.put_records(StreamName=self._stream, Records=records)
            for rec, res in zip(records, resp["Records"], strict=True):
                if "SequenceNumber" in res:
                    self.sent.append((res["ShardId"], res["SequenceNumber"], rec["Data"]))
                    self.put_at[res["SequenceNumber"]] = called
            # pacing to the rate, not waiting for a condition
            self._stop.wait(max(0.0, started + n / self._rate - time.monotonic()))

    def __enter__(self) -> Feeder:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
