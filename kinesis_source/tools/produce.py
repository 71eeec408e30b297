"""A load generator for Kinesis: numbered records at a steady rate, optionally KPL-aggregated.

Used by ``kinesis-ddb produce``, the demo and the benchmarks. Each user record's data is
``<prefix>-<n>`` padded to the record size, so a reader can check what arrived.

Aggregates hold user records of one shard only, as the KPL builds them: readers (KCL, this
source) drop user records outside the hash key range of the shard an aggregate landed in. The
shard map is listed once, so the stream must not be resharded while aggregates are put.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kinesis_source import kpl
from kinesis_source.sink.shards import ShardMap

_MAX_PER_CALL = 500  # PutRecords accepts at most 500 records


@dataclass(frozen=True)
class Sent:
    """One user record as Kinesis acknowledged it."""

    shard_id: str
    seq: str
    sub_seq: int
    data: bytes


class LoadProducer:
    """Writes numbered records to one stream."""

    def __init__(
        self,
        client: Any,
        stream: str,
        size: int = 100,
        keys: int = 64,
        aggregate: int = 0,
        prefix: str = "r",
    ) -> None:
        self._client = client
        self._stream = stream
        self._size = size
        self._keys = keys
        self._aggregate = aggregate
        self._prefix = prefix
        self.sent: list[Sent] = []
        self._lock = threading.Lock()
        self._shards: ShardMap | None = None
        self._shard_of: dict[str, str] = {}  # partition key -> its shard

    def payload(self, n: int) -> bytes:
        """The data of record number ``n``."""
        text = f"{self._prefix}-{n:09d}"
        return (text + "." * max(0, self._size - len(text))).encode()

    def _shard(self, key: str) -> str:
        """The open shard Kinesis routes ``key`` to (the stream's shards are listed once)."""
        if self._shards is None:
            self._shards = ShardMap.load(self._client, self._stream)
        if key not in self._shard_of:
            self._shard_of[key] = self._shards.shard_of(kpl.effective_hash_key(key))
        return self._shard_of[key]

    def _kinesis_records(self, first: int, count: int) -> list[tuple[dict, list[bytes]]]:
        users = [(f"key-{(first + i) % self._keys}", self.payload(first + i)) for i in range(count)]
        if not self._aggregate:
            return [({"PartitionKey": k, "Data": d}, [d]) for k, d in users]
        by_shard: dict[str, list[tuple[str, bytes]]] = {}
        for user in users:
            by_shard.setdefault(self._shard(user[0]), []).append(user)
        out = []
        for members in by_shard.values():
            for i in range(0, len(members), self._aggregate):
                group = members[i : i + self._aggregate]
                record = {"PartitionKey": group[0][0], "Data": kpl.encode(group)}
                out.append((record, [d for _, d in group]))
        return out

    def put(self, first: int, count: int) -> int:
        """Put user records ``first .. first + count - 1``; returns how many were put."""
        records = self._kinesis_records(first, count)
        for i in range(0, len(records), _MAX_PER_CALL):
            chunk = records[i : i + _MAX_PER_CALL]
            resp = self._client.put_records(StreamName=self._stream, Records=[r for r, _ in chunk])
            failed = resp.get("FailedRecordCount", 0)
            if failed:
                raise RuntimeError(f"{failed} records were refused by stream {self._stream}")
            with self._lock:
                for (_, users), result in zip(chunk, resp["Records"], strict=True):
                    for sub, data in enumerate(users):
                        self.sent.append(Sent(result["ShardId"], result["SequenceNumber"], sub, data))
        return count

    def run(
        self,
        records: int,
        rate: float,
        progress: Callable[[int], None] | None = None,
        stop: threading.Event | None = None,
    ) -> int:
        """Put ``records`` user records at about ``rate`` per second; returns how many."""
        per_call = max(1, min(_MAX_PER_CALL, int(rate / 10) or 1))
        started = time.monotonic()
        done = 0
        while done < records and not (stop and stop.is_set()):
            count = min(per_call, records - done)
            done += self.put(done, count)
            if progress:
                progress(done)
            ahead = done / rate - (time.monotonic() - started)
            if ahead > 0:  # pacing to the rate, not waiting for a condition
                if stop is not None:
                    stop.wait(ahead)
                else:
                    time.sleep(ahead)
        return done

    def snapshot(self) -> list[Sent]:
        """What was put so far."""
        with self._lock:
            return list(self.sent)
