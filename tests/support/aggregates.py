"""KPL aggregates made with aws-kinesis-agg (an encoder independent of our decoder)."""

from __future__ import annotations

import hashlib

from aws_kinesis_agg.aggregator import RecordAggregator


def aggregate(user_records: list[tuple[str, bytes] | tuple[str, bytes, str]]) -> tuple[str, bytes]:
    """One aggregated Kinesis record (partition key, data) holding ``user_records`` in order;
    a user record given as (partition key, data, explicit hash key) carries that hash key."""
    agg = RecordAggregator()
    for key, data, *hash_key in user_records:
        added = agg.add_user_record(key, data, *hash_key)
        assert added is None, "more than one aggregate's worth"
    partition_key, _, data = agg.clear_and_get().get_contents()
    return partition_key, data


def corrupt_checksum(data: bytes) -> bytes:
    """The same aggregate with one byte of its body flipped: the MD5 no longer matches, so
    (as for KCL and aws-kinesis-agg) it is a plain record that starts with the magic."""
    body = bytearray(data)
    body[10] ^= 0xFF
    return bytes(body)


def truncated_body(data: bytes) -> bytes:
    """The aggregate's protobuf cut short, with a matching MD5 (so only decoding can tell)."""
    body = data[4:-16][:-5]
    return data[:4] + body + hashlib.md5(body).digest()


def wrong_digest(data: bytes) -> bytes:
    """The aggregate's intact body with a digest that is not its MD5: a plain record that
    parses as an aggregate body, so only the MD5 check tells it apart."""
    return data[:-16] + bytes(16)


def with_digest(body: bytes) -> bytes:
    """Magic + ``body`` + its MD5: what passes as an aggregate whatever ``body`` holds."""
    return b"\xf3\x89\x9a\xc2" + body + hashlib.md5(body).digest()
