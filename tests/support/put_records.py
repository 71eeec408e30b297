"""``PutRecords`` as the test servers rewrite it: the records a proxy answers itself (a failure
rule, a write quota) are taken out of the request, the backend's answer for the others is
merged back into one entry per record, with AWS' messages; and the shard map that tells which
shard each record goes to."""

from __future__ import annotations

import base64
import bisect
import hashlib
import json
import threading
from typing import Any

import boto3
from botocore.exceptions import ClientError

THROTTLED = "ProvisionedThroughputExceededException"
INTERNAL_FAILURE = "InternalFailure"
ACCOUNT = "123456789012"  # moto's and kinesis-local's default account, named in AWS' messages


def record_error(code: str, stream: str | None, shard: str | None) -> dict[str, str]:
    """A failed ``PutRecords`` entry, with the message AWS gives for that code."""
    if code == THROTTLED:
        message = f"Rate exceeded for shard {shard} in stream {stream} under account {ACCOUNT}."
    elif code == INTERNAL_FAILURE:
        message = "Internal service failure."
    else:
        message = f"injected by the test proxy: {code}"
    return {"ErrorCode": code, "ErrorMessage": message}


def hash_key(record: dict[str, Any]) -> int | None:
    """Where Kinesis puts a record: its explicit hash key, else the MD5 of its partition key read as
    a 128-bit big-endian integer (``None`` if malformed: the backend will refuse it)."""
    try:
        if record.get("ExplicitHashKey"):
            return int(record["ExplicitHashKey"])
        return int.from_bytes(hashlib.md5(record["PartitionKey"].encode()).digest(), "big")
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def record_bytes(record: dict[str, Any]) -> int:
    """What a record costs a shard's write quota: its data blob and its partition key (UTF-8)."""
    data = record.get("Data") or ""
    return len(base64.b64decode(data)) + len((record.get("PartitionKey") or "").encode())


def without(body: bytes, unwritten: dict[int, dict[str, str]]) -> bytes | None:
    """The PutRecords body without the records at those positions; ``None`` if none is left."""
    if not unwritten:
        return body
    req = json.loads(body)
    req["Records"] = [r for i, r in enumerate(req["Records"]) if i not in unwritten]
    return json.dumps(req).encode() if req["Records"] else None


def merged(data: bytes, unwritten: dict[int, dict[str, str]]) -> bytes:
    """The backend's PutRecords answer for the forwarded records, as the answer to the whole
    request: one entry per record in the request's order, the proxy's failures in their places."""
    resp = json.loads(data)
    forwarded = iter(resp.get("Records", []))
    total = len(resp.get("Records", [])) + len(unwritten)
    resp["Records"] = [unwritten[i] if i in unwritten else next(forwarded) for i in range(total)]
    resp["FailedRecordCount"] = resp.get("FailedRecordCount", 0) + len(unwritten)
    return json.dumps(resp).encode()


class ShardMap:
    """The hash key ranges of each stream's open shards, from the backend's ListShards (asked
    directly, so no quota or rule of the proxy sees it); cached per stream until found stale."""

    def __init__(self, target_url: str) -> None:
        self._url = target_url
        self._client: Any = None
        self._ranges: dict[str, tuple[list[int], list[tuple[int, str]]]] = {}  # starts; (end, id)
        self._listed: dict[str, set[str]] = {}  # every shard id listed, closed ones too
        self._lock = threading.Lock()

    def shards(self, stream: str | None, keys: list[int | None]) -> list[str | None]:
        """The open shard owning each hash key; a key no cached range holds makes one ListShards."""
        owners = [self._owner(stream, k) for k in keys]
        if stream is not None and any(o is None and k is not None for o, k in zip(owners, keys, strict=True)):
            self._load(stream)
            owners = [self._owner(stream, k) for k in keys]
        return owners

    def written_to(self, stream: str, shard: str) -> None:
        """The backend wrote a record to ``shard``: if it was not listed, the stream was resharded
        since, and its ranges are listed again when next needed."""
        listed = self._listed.get(stream)
        if listed is not None and shard not in listed:
            self._ranges.pop(stream, None)
            self._listed.pop(stream, None)

    def _owner(self, stream: str | None, key: int | None) -> str | None:
        cached = self._ranges.get(stream) if stream is not None else None
        if cached is None or key is None:
            return None
        starts, shards = cached
        i = bisect.bisect_right(starts, key) - 1
        return shards[i][1] if i >= 0 and key <= shards[i][0] else None

    def _load(self, stream: str) -> None:
        with self._lock:
            if self._client is None:
                self._client = boto3.client(
                    "kinesis", endpoint_url=self._url, region_name="us-east-1",
                    aws_access_key_id="local", aws_secret_access_key="local",
                )
            try:
                pages = self._client.get_paginator("list_shards").paginate(StreamName=stream)
                listed = [s for page in pages for s in page["Shards"]]
            except ClientError:  # no such stream: the backend answers the write itself
                return
        ranges = sorted(
            (int(s["HashKeyRange"]["StartingHashKey"]), int(s["HashKeyRange"]["EndingHashKey"]), s["ShardId"])
            for s in listed
            if "EndingSequenceNumber" not in s["SequenceNumberRange"]  # closed: no longer written
        )
        self._ranges[stream] = ([start for start, _, _ in ranges], [(end, sid) for _, end, sid in ranges])
        self._listed[stream] = {s["ShardId"] for s in listed}
