"""Committed positions order as strings exactly as they order in the shard."""

import pytest

from kinesis_source.checkpoints import advances, item_key, offset_key_of, order_key
from kinesis_source.positions import Position

SEQ = "49590338271490256608559692538361571095921575989136588898"


def test_order_key_orders_like_integers():
    assert order_key(Position.after("10")) > order_key(Position.after("9"))
    assert order_key(Position.after(SEQ)) > order_key(Position.after("9" * 55))


def test_order_within_a_record_and_shard_end():
    at, sub1, sub2, after = (
        Position.at(SEQ),
        Position.after(SEQ, 1),
        Position.after(SEQ, 2),
        Position.after(SEQ),
    )
    assert order_key(at) < order_key(sub1) < order_key(sub2) < order_key(after)
    assert order_key(after) < order_key(Position.shard_end())
    assert order_key(Position.after("9" * 128)) < order_key(Position.shard_end())


@pytest.mark.parametrize("start", [Position.trim_horizon(), Position.at_timestamp(__import__("datetime").datetime.now(__import__("datetime").timezone.utc))])
def test_starting_points_are_not_commit_positions(start):
    assert order_key(start) is None
    assert not advances(start, None)


def test_advances():
    assert advances(Position.after("5"), None)
    assert advances(Position.after("10"), Position.after("9"))
    assert not advances(Position.after("9"), Position.after("10"))
    assert not advances(Position.after("9"), Position.after("9"))
    assert advances(Position.shard_end(), Position.after("9"))


def test_item_keys_round_trip():
    assert item_key("my.stream/shardId-000000000001") == "shard#my.stream#shardId-000000000001"
    assert offset_key_of("shard#my.stream#shardId-000000000001") == "my.stream/shardId-000000000001"


def test_kcl_lease_items_become_positions():
    from kinesis_source.cli import kcl_positions

    items = [
        {"leaseKey": {"S": "shardId-000000000001"}, "checkpoint": {"S": "4959"}, "checkpointSubSequenceNumber": {"N": "3"}},
        {"leaseKey": {"S": "shardId-000000000000"}, "checkpoint": {"S": "SHARD_END"}},
        {"leaseKey": {"S": "123456789012:other:1700000000:shardId-000000000007"}, "checkpoint": {"S": "TRIM_HORIZON"}},
        {"leaseKey": {"S": "shardId-000000000002"}, "checkpoint": {"S": "LATEST"}},
    ]
    assert kcl_positions(items, "orders") == {
        "orders/shardId-000000000000": "SHARD_END",
        "orders/shardId-000000000001": "AFTER:4959:3",
        "orders/shardId-000000000002": "LATEST",
        "other/shardId-000000000007": "TRIM_HORIZON",
    }


def test_bucket_keys_are_stable_and_spread():
    import zlib

    from kinesis_source.checkpoints import BUCKETS, bucket_key

    key = "my.stream/shardId-000000000001"
    # CRC32, not Python's salted hash: every process and release puts a shard in the same item
    assert bucket_key(key) == f"shards#{zlib.crc32(key.encode()) % BUCKETS:02d}"
    used = {bucket_key(f"s/shardId-{i:012d}") for i in range(1000)}
    assert len(used) == BUCKETS


def test_transactions_respect_dynamodb_item_and_size_limits():
    from kinesis_source.checkpoints import _MAX_TRANSACT_BYTES, _transactions

    small = [(f"k{i}", {}, 10) for i in range(250)]
    assert [len(c) for c in _transactions(small)] == [99, 99, 52]  # + the epoch check each
    big = [(f"b{i}", {}, 300_000) for i in range(30)]
    chunks = _transactions(big)
    assert all(sum(w[2] for w in c) <= _MAX_TRANSACT_BYTES for c in chunks)
    assert [w for c in chunks for w in c] == big  # in order, none lost
    assert len(chunks) == 3
