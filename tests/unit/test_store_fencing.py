"""Fencing and never-backwards, on a real boto3 DynamoDB client stubbed by botocore's Stubber.

No server: each test queues the responses DynamoDB would give and sees every request the store
sends. The answers are written out here (the meta item's key, ``epoch = :e`` with the caller's
epoch, the stored and committed position strings), not computed by the store.

Mutants caught:
- the epoch ``ConditionCheck`` removed from ``FencedWriter.run`` (checkpoints/writes.py) (the
  transactions of commit, migrate, save_initial and reset then go out unfenced);
- the ``epoch <= :e`` condition dropped from a compaction's bucket writes
  (checkpoints/commit_log.py: a fenced query's late compaction would overwrite a newer one);
- ``CheckpointStore.commit`` skipping its "behind" check (a commit behind the stored position
  then sends a transaction lowering it).
"""

from __future__ import annotations

import copy
import json

import boto3
import pytest
from botocore.stub import ANY, Stubber

from kinesis_source.checkpoints import commit_log
from kinesis_source.checkpoints import format as checkpoint_format
from kinesis_source.checkpoints.deltas import unpack
from kinesis_source.checkpoints.format import bucket_key
from kinesis_source.checkpoints.store import CheckpointStore
from kinesis_source.errors import CheckpointError
from kinesis_source.positions import Offset, Position, ShardId

TABLE = "ckpt"
APP = "app-1"
META = {"app": {"S": APP}, "key": {"S": "meta"}}
A, B = ShardId("s", "a"), ShardId("s", "b")


class Recorded:
    """A stubbed client and every request the store made with it, in order."""

    def __init__(self) -> None:
        self.client = boto3.client(
            "dynamodb", region_name="us-east-1",
            aws_access_key_id="stub", aws_secret_access_key="stub",
        )
        self.stub = Stubber(self.client)
        self.calls: list[tuple[str, dict]] = []
        # Seen before the Stubber answers, so a call it refuses (not queued) is seen too.
        self.client.meta.events.register("provide-client-params.dynamodb.*", self._seen)
        self.stub.activate()

    def _seen(self, params, model, **_):
        self.calls.append((model.name, copy.deepcopy(params)))

    def transactions(self) -> list[list[dict]]:
        return [p["TransactItems"] for name, p in self.calls if name == "TransactWriteItems"]

    def table_holds(self, epoch: int, positions: dict[str, str], legacy: dict[str, str] | None = None):
        """Queue the Query of a snapshot: the meta item at ``epoch``, bucket items holding
        ``positions`` (offset key -> position string), format-1 items holding ``legacy``."""
        legacy = legacy or {}
        buckets: dict[str, dict] = {}
        for key, pos in positions.items():
            buckets.setdefault(bucket_key(ShardId.parse(key)), {})[key] = {
                "committedAt": "2026-01-01T00:00:00.000+00:00", "epoch": epoch,
                "owner": "o", "position": pos,
            }
        items = [{**META, "epoch": {"N": str(epoch)}, "formatVersion": {"N": "3"}}]
        items += [
            {"app": {"S": APP}, "key": {"S": b}, "positions": {"S": json.dumps(body)},
             "version": {"N": "4"}, "epoch": {"N": str(epoch)}}
            for b, body in sorted(buckets.items())
        ]
        for key, pos in legacy.items():
            stream, shard = key.split("/")
            items.append({"app": {"S": APP}, "key": {"S": f"shard#{stream}#{shard}"},
                          "position": {"S": pos}, "epoch": {"N": "1"}})
        self.stub.add_response(
            "query", {"Items": items, "Count": len(items)},
            {"TableName": TABLE, "KeyConditionExpression": "app = :a",
             "ExpressionAttributeValues": {":a": {"S": APP}}, "ConsistentRead": True},
        )

    def transaction_succeeds(self, times: int = 1) -> None:
        for _ in range(times):
            self.stub.add_response("transact_write_items", {}, {"TransactItems": ANY})

    def puts(self) -> list[dict]:
        return [p for name, p in self.calls if name == "PutItem"]


@pytest.fixture
def ddb():
    rec = Recorded()
    yield rec
    rec.stub.deactivate()


def assert_fenced(transaction: list[dict], epoch: int) -> None:
    """The transaction's first item fails it unless the meta item holds ``epoch``: a
    ConditionCheck on the meta item, or an Update of it under the same condition."""
    assert transaction, "an empty transaction"
    (kind, op), = transaction[0].items()
    assert kind in ("ConditionCheck", "Update"), transaction[0]
    assert op["TableName"] == TABLE and op["Key"] == META
    assert op["ConditionExpression"] == "epoch = :e"
    assert op["ExpressionAttributeValues"][":e"] == {"N": str(epoch)}
    others = [next(iter(item.values())) for item in transaction[1:]]
    assert all(o["Key" if "Key" in o else "Item"]["key"] != META["key"] for o in others)


def written_positions(transactions: list[list[dict]]) -> dict[str, str]:
    """The positions the transactions' log entries hold (format 4 commits only log)."""
    out = {}
    for transaction in transactions:
        for item in transaction:
            put = item.get("Put")
            assert not put or not put["Item"]["key"]["S"].startswith("shards#"), put
            if put and put["Item"]["key"]["S"].startswith("log#"):
                out.update(unpack(put["Item"]["packed"]["B"])["positions"])
    return out


S56 = "49590338271490256608559692538361571095921575989136588898"


def test_a_commit_is_fenced_by_the_callers_epoch(ddb):
    ddb.table_holds(7, {"s/a": "AFTER:10"})
    ddb.transaction_succeeds()
    store = CheckpointStore(ddb.client, TABLE, APP)
    assert store.commit(7, "o", {A: Position.after("11"), B: Position.shard_end()}) == 1
    [transaction] = ddb.transactions()
    assert_fenced(transaction, 7)
    assert written_positions([transaction]) == {"s/a": "AFTER:11", "s/b": "SHARD_END"}
    ddb.stub.assert_no_pending_responses()


def test_every_transaction_of_a_large_commit_is_fenced(ddb, monkeypatch):
    # log entries of a few hundred bytes, a few in each transaction
    monkeypatch.setattr(commit_log, "MAX_ITEM_BYTES", 600)
    monkeypatch.setattr(checkpoint_format, "MAX_TRANSACT_BYTES", 2_000)
    ddb.table_holds(3, {})
    ddb.transaction_succeeds(times=64)
    store = CheckpointStore(ddb.client, TABLE, APP)
    positions = {ShardId("s", f"shardId-{i:012d}"): Position.after(f"{S56[:-3]}{i:03d}") for i in range(300)}
    calls = store.commit(3, "o", positions)
    transactions = ddb.transactions()
    assert calls == len(transactions) > 1
    for transaction in transactions:
        assert_fenced(transaction, 3)
    assert written_positions(transactions) == {str(k): p.to_str() for k, p in positions.items()}


def test_forgetting_and_migrating_are_fenced(ddb):
    ddb.table_holds(5, {"s/p": "SHARD_END", "s/c": "AFTER:1"})
    ddb.transaction_succeeds()
    store = CheckpointStore(ddb.client, TABLE, APP)
    assert store.commit(5, "o", {}, forget=[ShardId("s", "p")]) == 1
    ddb.table_holds(6, {}, legacy={"s/old": "AFTER:99"})
    ddb.stub.add_response("put_item", {})
    ddb.transaction_succeeds()
    assert CheckpointStore(ddb.client, TABLE, APP).migrate(6) == 2
    first, second = ddb.transactions()
    assert_fenced(first, 5)
    assert unpack(first[1]["Put"]["Item"]["packed"]["B"])["dropped"] == ["s/p"]
    [bucket] = ddb.puts()  # the migrated position, in its bucket, before the old item goes
    assert bucket["Item"]["key"]["S"] == bucket_key(ShardId("s", "old"))
    assert bucket["ConditionExpression"] == "attribute_not_exists(#k) OR epoch <= :e"
    assert bucket["ExpressionAttributeValues"][":e"] == {"N": "6"}
    assert_fenced(second, 6)
    deleted = [i["Delete"]["Key"]["key"]["S"] for i in second if "Delete" in i]
    assert deleted == ["shard#s#old"]


def test_saving_initial_positions_is_fenced_in_every_transaction(ddb, monkeypatch):
    monkeypatch.setattr(checkpoint_format, "MAX_TRANSACT_BYTES", 2_000)
    ddb.table_holds(9, {})
    ddb.transaction_succeeds(times=64)
    store = CheckpointStore(ddb.client, TABLE, APP)
    resolved = Offset({ShardId("s", f"shardId-{i:012d}"): Position.after(S56) for i in range(200)})
    store.save_initial(9, "LATEST", resolved, {"s": "t0"})
    *earlier, last = ddb.transactions()
    assert earlier
    for transaction in earlier:
        assert_fenced(transaction, 9)
        assert "ConditionCheck" in transaction[0]
    assert_fenced(last, 9)
    assert "Update" in last[0]  # the meta item names the new set with the last writes


def test_reset_fences_with_the_epoch_it_claimed(ddb):
    ddb.stub.add_response(
        "update_item",
        {"Attributes": {**META, "epoch": {"N": "12"}, "formatVersion": {"N": "3"},
                        "owner": {"S": "reset by me"}}},
    )
    ddb.stub.add_response("update_item", {})
    ddb.table_holds(12, {"s/a": "AFTER:5"})
    ddb.transaction_succeeds()
    CheckpointStore(ddb.client, TABLE, APP).reset("TRIM_HORIZON", by="me")
    meta_update = [p for name, p in ddb.calls if name == "UpdateItem"][1]
    assert meta_update["ConditionExpression"] == "epoch = :e"
    assert meta_update["ExpressionAttributeValues"][":e"] == {"N": "12"}
    # what any epoch before the reset wrote is retired at once, whatever the deletes leave
    assert "baseEpoch = :b" in meta_update["UpdateExpression"]
    assert meta_update["ExpressionAttributeValues"][":b"] == {"N": "12"}
    [transaction] = ddb.transactions()
    assert_fenced(transaction, 12)
    assert [i["Delete"]["Key"]["key"]["S"] for i in transaction[1:]] == [bucket_key(A)]


# (stored, committed): each committed position is behind the stored one in the shard's order
# AT:s < AFTER:s:sub < AFTER:s < SHARD_END, and sequence numbers compare as integers.
BEHIND = [
    ("AFTER:100", "AFTER:99"),
    ("AFTER:1000000000", "AFTER:999999999"),  # 10 digits ahead of 9
    (f"AFTER:{S56}", "AFTER:99999999999999999999999999999999999999999999999999999"),
    (f"AFTER:{S56}", f"AFTER:{S56}:4"),
    (f"AFTER:{S56}:5", f"AFTER:{S56}:4"),
    (f"AFTER:{S56}:0", f"AT:{S56}"),
    (f"AT:{S56}", f"AFTER:{int(S56) - 1}"),
    ("SHARD_END", f"AFTER:{S56}"),
    ("SHARD_END", "AT:1"),
]


@pytest.mark.parametrize("stored, committed", BEHIND, ids=[f"pair{i}" for i in range(len(BEHIND))])
def test_a_commit_behind_the_stored_position_raises_and_sends_nothing(ddb, stored, committed):
    ddb.table_holds(2, {"s/a": stored, "s/b": "AFTER:1"})
    store = CheckpointStore(ddb.client, TABLE, APP)
    with pytest.raises(CheckpointError) as err:
        # s/b moves forward, but s/a would move back: nothing is written
        store.commit(2, "o", {A: Position.parse(committed), B: Position.after("2")})
    assert "Refused to move shard(s) s/a" in str(err.value) and "backwards" in str(err.value)
    assert ddb.transactions() == []
    ddb.stub.assert_no_pending_responses()


@pytest.mark.parametrize("stored, committed", BEHIND, ids=[f"pair{i}" for i in range(len(BEHIND))])
def test_a_commit_ahead_of_the_stored_position_is_written(ddb, stored, committed):
    """The same pairs the other way round move forward (so the refusals above are about
    order, not about the kinds of position)."""
    ddb.table_holds(2, {"s/a": committed})
    ddb.transaction_succeeds()
    store = CheckpointStore(ddb.client, TABLE, APP)
    assert store.commit(2, "o", {A: Position.parse(stored)}) == 1
    [transaction] = ddb.transactions()
    assert_fenced(transaction, 2)
    assert written_positions([transaction]) == {"s/a": stored}


def test_a_commit_equal_to_the_stored_position_sends_nothing(ddb):
    ddb.table_holds(2, {"s/a": f"AFTER:{S56}:3"})
    store = CheckpointStore(ddb.client, TABLE, APP)
    assert store.commit(2, "o", {A: Position.after(S56, 3)}) == 0
    assert ddb.transactions() == []


def test_a_commit_behind_what_this_store_itself_wrote_raises_and_sends_nothing(ddb):
    ddb.table_holds(4, {})
    ddb.transaction_succeeds()
    store = CheckpointStore(ddb.client, TABLE, APP)
    store.commit(4, "o", {A: Position.after("1000000000")})
    with pytest.raises(CheckpointError, match="Refused to move shard"):
        store.commit(4, "o", {A: Position.after("999999999")})
    assert len(ddb.transactions()) == 1
    ddb.stub.assert_no_pending_responses()


@pytest.mark.parametrize(("owner", "says", "not_says"), [
    ("reset by ops-laptop", "was reset (reset by ops-laptop", "stop the other query"),
    ("host:123:abcd", "was claimed by another query (owner host:123:abcd", "was reset"),
])
def test_the_fenced_query_is_told_whether_a_reset_or_another_query_took_over(ddb, owner, says, not_says):
    ddb.stub.add_response("get_item", {"Item": {**META, "epoch": {"N": "8"}, "owner": {"S": owner}}})
    with pytest.raises(CheckpointError) as err:
        CheckpointStore(ddb.client, TABLE, APP).check_epoch(7)
    assert says in str(err.value) and not_says not in str(err.value), str(err.value)
