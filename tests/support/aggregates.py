"""KPL aggregates made with aws-kinesis-agg (an encoder independent of our decoder)."""

from __future__ import annotations

import hashlib

from aws_kinesis_agg.aggregator import RecordAggregator


def aggregate(user_records: list[tuple[str, bytes]]) -> tuple[str, bytes]:
    """One aggregated Kinesis record (partition key, data) holding ``user_records`` in order."""
    agg = RecordAggregator()
    for key, data in user_records:
        assert agg.add_user_record(key, data) is None, "more than one aggregate's worth"
    partition_key, _, data = agg.clear_and_get().get_contents()
    return partition_key, data


def corrupt_checksum(data: bytes) -> bytes:
    """The same aggregate with one byte of its body flipped (MD5 no longer matches)."""
    body = bytearray(data)
    body[10] ^= 0xFF
    return bytes(body)


def truncated_body(data: bytes) -> bytes:
    """The aggregate's protobuf cut short, with a matching MD5 (so only decoding can tell)."""
    body = data[4:-16][:-5]
    return data[:4] + body + hashlib.md5(body).digest()
