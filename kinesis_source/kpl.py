"""KPL aggregated records: recognise and expand them into user records.

An aggregated Kinesis record is ``F3 89 9A C2`` + a protobuf ``AggregatedRecord`` + the MD5 of
that protobuf. The message is small and fixed, so it is decoded here by hand (no protobuf
runtime): ``AggregatedRecord { repeated string partition_key_table = 1; repeated string
explicit_hash_key_table = 2; repeated Record records = 3; }`` and ``Record { uint64
partition_key_index = 1; uint64 explicit_hash_key_index = 2; bytes data = 3; repeated Tag tags =
4; }``. Each user record keeps the Kinesis record's sequence number and arrival time and gets its
index as ``SubSequenceNumber`` and its own partition key.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Iterable, Iterator

log = logging.getLogger(__name__)

MAGIC = b"\xf3\x89\x9a\xc2"
_DIGEST = 16


class CorruptAggregateError(ValueError):
    """A record with the aggregation magic whose body does not decode."""


def is_aggregate(data: bytes) -> bool:
    """True when ``data`` starts with the KPL magic."""
    return data[:4] == MAGIC


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise CorruptAggregateError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise CorruptAggregateError("varint too long")


def _fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field of a protobuf message."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, wire, value
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > end:
                raise CorruptAggregateError(f"field {number} runs past the end")
            yield number, wire, buf[pos : pos + size]
            pos += size
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise CorruptAggregateError(f"unknown wire type {wire}")
        if pos > end:
            raise CorruptAggregateError("truncated field")


def decode(data: bytes) -> list[tuple[str, bytes, str | None]]:
    """(partition key, data, explicit hash key) of each user record of an aggregate."""
    if len(data) < len(MAGIC) + _DIGEST:
        raise CorruptAggregateError("shorter than magic and checksum")
    body, digest = data[len(MAGIC) : -_DIGEST], data[-_DIGEST:]
    if hashlib.md5(body).digest() != digest:
        raise CorruptAggregateError("MD5 checksum mismatch")
    keys: list[str] = []
    hash_keys: list[str] = []
    raw: list[bytes] = []
    for number, wire, value in _fields(body):
        if wire != 2:
            continue
        if number == 1:
            keys.append(value.decode())  # type: ignore[union-attr]
        elif number == 2:
            hash_keys.append(value.decode())  # type: ignore[union-attr]
        elif number == 3:
            raw.append(value)  # type: ignore[arg-type]
    return [_user_record(rec, keys, hash_keys) for rec in raw]


def count_user_records(data: bytes) -> int:
    """How many user records a Kinesis record's data holds (1 unless it is an aggregate).

    Used to plan read limits on the driver, so it skips the MD5 check: a corrupt aggregate
    counts as 1 (it fails or is skipped when read, as ``onCorruptAggregate`` says).
    """
    if not is_aggregate(data) or len(data) < len(MAGIC) + _DIGEST:
        return 1
    try:
        count = sum(
            1 for number, wire, _ in _fields(data[len(MAGIC) : -_DIGEST]) if number == 3 and wire == 2
        )
    except CorruptAggregateError:
        return 1
    return max(count, 1)


def _user_record(
    rec: bytes, keys: list[str], hash_keys: list[str]
) -> tuple[str, bytes, str | None]:
    # The hot loop of de-aggregation: one Record message, parsed inline (measured ~1.5x the
    # generic field iterator).
    pk_index = ehk_index = None
    payload = b""
    pos, end = 0, len(rec)
    while pos < end:
        key = rec[pos]
        if key & 0x80:
            key, pos = _varint(rec, pos)
        else:
            pos += 1
        number, wire = key >> 3, key & 7
        if wire == 0:
            value = rec[pos] if pos < end else 0x80
            if value & 0x80:
                value, pos = _varint(rec, pos)
            else:
                pos += 1
            if number == 1:
                pk_index = value
            elif number == 2:
                ehk_index = value
        elif wire == 2:
            size, pos = _varint(rec, pos)
            if pos + size > end:
                raise CorruptAggregateError(f"field {number} runs past the end")
            if number == 3:
                payload = rec[pos : pos + size]
            pos += size
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise CorruptAggregateError(f"unknown wire type {wire}")
    if pos > end:
        raise CorruptAggregateError("truncated record")
    if pk_index is None or pk_index >= len(keys):
        raise CorruptAggregateError(f"partition key index {pk_index} outside the key table")
    if ehk_index is not None and ehk_index >= len(hash_keys):
        raise CorruptAggregateError(f"explicit hash key index {ehk_index} outside its table")
    return keys[pk_index], payload, hash_keys[ehk_index] if ehk_index is not None else None


def expand(
    records: Iterable[dict], where: str, on_corrupt: str = "fail"
) -> tuple[list[dict], int]:
    """User records of a page, in order; returns them and how many aggregates were skipped.

    ``where`` (``<stream>/<shardId>``) names the shard in errors. ``on_corrupt`` is ``fail``
    (raise naming shard and sequence number) or ``skip`` (drop the record, log a warning).
    """
    out: list[dict] = []
    skipped = 0
    for rec in records:
        data = rec["Data"]
        if not is_aggregate(data):
            out.append(rec)
            continue
        try:
            users = decode(data)
        except CorruptAggregateError as exc:
            message = (
                f"Corrupt KPL aggregate in shard {where} at sequence number "
                f"{rec['SequenceNumber']}: {exc}"
            )
            if on_corrupt == "skip":
                skipped += 1
                log.warning("%s; skipped (onCorruptAggregate=skip)", message)
                continue
            raise CorruptAggregateError(
                f"{message}. Set onCorruptAggregate=skip to skip such records."
            ) from None
        for sub, (key, payload, _) in enumerate(users):
            out.append(
                {
                    "Data": payload,
                    "PartitionKey": key,
                    "SequenceNumber": rec["SequenceNumber"],
                    "SubSequenceNumber": sub,
                    "ApproximateArrivalTimestamp": rec.get("ApproximateArrivalTimestamp"),
                }
            )
    return out, skipped


def _put_varint(out: bytearray, value: int) -> None:
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _put_bytes(out: bytearray, number: int, data: bytes) -> None:
    _put_varint(out, (number << 3) | 2)
    _put_varint(out, len(data))
    out += data


def encode(user_records: list[tuple[str, bytes]]) -> bytes:
    """One aggregated record holding ``(partition key, data)`` user records, in order (what
    ``kinesis-ddb produce --aggregate`` writes; the tests decode aws-kinesis-agg's instead)."""
    keys: dict[str, int] = {}
    body = bytearray()
    for key, _ in user_records:
        if key not in keys:
            keys[key] = len(keys)
            _put_bytes(body, 1, key.encode())
    for key, data in user_records:
        rec = bytearray()
        _put_varint(rec, (1 << 3) | 0)
        _put_varint(rec, keys[key])
        _put_bytes(rec, 3, data)
        _put_bytes(body, 3, bytes(rec))
    return MAGIC + bytes(body) + hashlib.md5(bytes(body)).digest()
