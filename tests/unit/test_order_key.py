"""Committed positions order as strings exactly as they order in the shard."""

import datetime

import pytest

from kinesis_source.checkpoints.format import advances, item_key, order_key, shard_of_item_key
from kinesis_source.positions import Position, ShardId

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


@pytest.mark.parametrize(
    "start",
    [Position.trim_horizon(), Position.at_timestamp(datetime.datetime.now(datetime.timezone.utc))],
)
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
    sid = ShardId("my.stream", "shardId-000000000001")
    assert item_key(sid) == "shard#my.stream#shardId-000000000001"
    assert shard_of_item_key("shard#my.stream#shardId-000000000001") == sid


# Sort keys of the bucket items format 2's release wrote for these shards, copied from
# tests/fixtures/checkpoints/format2.json (and format3.json for the initial#NN ones).
GOLDEN_BUCKETS = {
    "orders/shardId-000000000000": "shards#47",
    "orders/shardId-000000000001": "shards#57",
    "orders/shardId-000000000003": "shards#21",
    "audit-log/shardId-000000000020": "shards#21",
    "orders/shardId-000000000004": "shards#54",
    "clicks.v2/shardId-000000000000": "shards#43",
    "clicks.v2/shardId-000000000001": "shards#61",
    "clicks.v2/shardId-000000000002": "shards#07",
}
GOLDEN_INITIAL_BUCKETS = {
    "orders/shardId-000000000000": "initial#47",
    "orders/shardId-000000000002": "initial#03",
    "audit-log/shardId-000000000020": "initial#21",
}


def test_bucket_keys_are_the_ones_the_format_2_release_wrote():
    """A shard's bucket is fixed by the stored format (CRC32 of its offset key modulo 64, not
    Python's salted hash): every process and release must put it in the same item. Mutant
    caught: ``BUCKETS = 32`` in kinesis_source/checkpoints.py."""
    from kinesis_source.checkpoints.format import bucket_key, initial_bucket_key

    assert {k: bucket_key(ShardId.parse(k)) for k in GOLDEN_BUCKETS} == GOLDEN_BUCKETS
    assert {
        k: initial_bucket_key(ShardId.parse(k)) for k in GOLDEN_INITIAL_BUCKETS
    } == GOLDEN_INITIAL_BUCKETS
    used = {bucket_key(ShardId("s", f"shardId-{i:012d}")) for i in range(1000)}
    assert used == {f"shards#{n:02d}" for n in range(64)}


def test_the_golden_fixtures_hold_each_shard_in_the_bucket_it_belongs_to():
    """Every bucket item of the format-2 and format-3 fixtures holds only shards whose
    bucket_key is that item (so the literals above agree with what those releases wrote)."""
    import json
    from pathlib import Path

    from kinesis_source.checkpoints.format import bucket_key, initial_bucket_key

    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints"
    kinds = {"shards#": bucket_key, "initial#": initial_bucket_key}
    format2_buckets = {}
    for name in ("format2.json", "format3.json"):
        for item in json.loads((fixtures / name).read_text())["items"]:
            key = item["key"]["S"]
            kind = key.partition("#")[0] + "#"
            if kind in kinds:
                for offset_key in json.loads(item["positions"]["S"]):
                    assert kinds[kind](ShardId.parse(offset_key)) == key, (name, offset_key)
                    if name == "format2.json":
                        format2_buckets[offset_key] = key
    assert format2_buckets == GOLDEN_BUCKETS


def test_transactions_respect_dynamodb_item_and_size_limits():
    from kinesis_source.checkpoints.format import MAX_TRANSACT_BYTES, transactions

    small = [(f"k{i}", {}, 10) for i in range(250)]
    assert [len(c) for c in transactions(small)] == [99, 99, 52]  # + the epoch check each
    big = [(f"b{i}", {}, 300_000) for i in range(30)]
    chunks = transactions(big)
    assert all(sum(w[2] for w in c) <= MAX_TRANSACT_BYTES for c in chunks)
    assert [w for c in chunks for w in c] == big  # in order, none lost
    assert len(chunks) == 3


def test_initial_buckets_are_numbered_as_the_position_buckets():
    from kinesis_source.checkpoints.format import bucket_key, initial_bucket_key

    for i in range(200):
        sid = ShardId("s", f"shardId-{i:012d}")
        assert initial_bucket_key(sid) == "initial#" + bucket_key(sid).removeprefix("shards#")


class RecordingClient:
    """Just enough of a DynamoDB client to see the transactions a store sends."""

    def __init__(self):
        self.transactions = []

    def transact_write_items(self, TransactItems):
        self.transactions.append(TransactItems)
        return {}


def test_the_meta_item_names_the_initial_positions_only_in_the_last_transaction(monkeypatch):
    import json

    from kinesis_source.checkpoints import format as checkpoint_format
    from kinesis_source.checkpoints.format import initial_bucket_key
    from kinesis_source.checkpoints.store import CheckpointStore
    from kinesis_source.positions import Offset

    monkeypatch.setattr(checkpoint_format, "MAX_TRANSACT_BYTES", 5_000)
    client = RecordingClient()
    store = CheckpointStore(client, "t", "app")
    stale = "initial#99"  # an item of an earlier set, as the last snapshot saw it
    store.writer.initial_keys = {stale}
    resolved = Offset({ShardId("s", f"shardId-{i:012d}"): Position.after(SEQ) for i in range(300)})
    store.save_initial(7, "LATEST", resolved, {"s": "t0"})

    *earlier, last = client.transactions
    assert earlier, "expected several transactions"
    assert all("ConditionCheck" in t[0] for t in earlier)  # fenced, the meta item untouched
    update = last[0]["Update"]
    assert update["ConditionExpression"] == "epoch = :e"
    assert update["ExpressionAttributeValues"][":e"] == {"N": "7"}
    set_id = update["ExpressionAttributeValues"][":i"]["S"]
    ops = [op for t in client.transactions for op in t[1:]]
    puts = [op["Put"]["Item"] for op in ops if "Put" in op]
    assert {p["initialId"]["S"] for p in puts} == {set_id}
    stored = {k: v for p in puts for k, v in json.loads(p["positions"]["S"]).items()}
    assert stored == {str(k): p.to_str() for k, p in resolved.shards.items()}
    assert {p["key"]["S"] for p in puts} == {initial_bucket_key(k) for k in resolved.shards}
    assert [op["Delete"]["Key"]["key"]["S"] for op in ops if "Delete" in op] == [stale]
    assert store.writer.initial_keys == {p["key"]["S"] for p in puts}
