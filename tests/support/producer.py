"""Test producer: numbered records, put in bursts, with what was put remembered."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Put:
    """One record as Kinesis acknowledged it."""

    data: bytes
    partition_key: str
    shard_id: str
    seq: str


@dataclass
class Producer:
    """Puts numbered records ``<tag>-<n>`` round-robin over partition keys."""

    client: Any
    stream: str
    tag: str = "r"
    keys: int = 16
    sent: list[Put] = field(default_factory=list)

    def put(self, count: int, burst: int = 100, hash_key: str | None = None) -> list[Put]:
        """Put ``count`` records in ``PutRecords`` calls of ``burst``; returns them.
        ``hash_key`` (an ``ExplicitHashKey``) sends them all to the shard owning it."""
        out: list[Put] = []
        while count > 0:
            n = min(burst, count)
            base = len(self.sent) + len(out)
            batch = [
                {"Data": f"{self.tag}-{base + i}".encode(), "PartitionKey": f"k{(base + i) % self.keys}"}
                for i in range(n)
            ]
            if hash_key is not None:
                for rec in batch:
                    rec["ExplicitHashKey"] = hash_key
            resp = self.client.put_records(StreamName=self.stream, Records=batch)
            assert resp.get("FailedRecordCount", 0) == 0, resp
            for rec, res in zip(batch, resp["Records"], strict=True):
                rec.pop("ExplicitHashKey", None)
                out.append(Put(rec["Data"], rec["PartitionKey"], res["ShardId"], res["SequenceNumber"]))
            count -= n
        self.sent.extend(out)
        return out
