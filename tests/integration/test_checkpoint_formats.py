"""Every stored checkpoint format, as the release that wrote it left it, is read by this one.

The fixtures (tests/fixtures/checkpoints, see its README) are raw DynamoDB items written by
the releases of formats 1, 2 and 3, with the positions they were given. Loaded into a fresh
table with ``put_item``, the current store must read the same positions and initial positions,
and a current claim and commit must carry them forward (migrating format 1's items) into the
same bucket items format 2's release wrote. Mutant these catch: ``BUCKETS = 32`` in
kinesis_source/checkpoints.py (a commit on an old application then writes other ``shards#NN``
items than format 2's release did, and leaves the old ones stale).
"""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path

import pytest

from kinesis_source.checkpoints.deltas import unpack
from kinesis_source.checkpoints.format import FORMAT_VERSION, bucket_key
from kinesis_source.checkpoints.store import CheckpointStore
from kinesis_source.positions import Offset, Position, ShardId

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints"
FORMATS = [1, 2, 3, 4]


def fixture(version: int) -> dict:
    return json.loads((FIXTURES / f"format{version}.json").read_text())


def positions(raw: dict[str, str]) -> dict[ShardId, Position]:
    return {ShardId.parse(k): Position.parse(v) for k, v in raw.items()}


def sort_keys(items: list[dict], prefix: str) -> set[str]:
    return {i["key"]["S"] for i in items if i["key"]["S"].startswith(prefix)}


@pytest.fixture
def table(ddb):
    name = f"golden-{uuid.uuid4().hex[:8]}"
    CheckpointStore(ddb, name, "unused").ensure_table(create=True)
    yield name
    ddb.delete_table(TableName=name)


def load(ddb, table: str, version: int) -> dict:
    data = fixture(version)
    for item in data["items"]:
        ddb.put_item(TableName=table, Item=client_form(item))
    return data


def client_form(item: dict) -> dict:
    """A fixture's item (DynamoDB's JSON: binaries in base64) as the boto3 client takes it."""
    return {
        name: {"B": base64.b64decode(value["B"])} if "B" in value else value
        for name, value in item.items()
    }


def bucket_shards(item: dict) -> set[str]:
    """The offset keys a bucket item holds, in format 2/3's JSON or format 4's packed form."""
    if "packed" in item:
        return set(unpack(item["packed"]["B"]))
    return set(json.loads(item["positions"]["S"]))


def stored_items(ddb, table: str, app: str) -> list[dict]:
    return ddb.get_paginator("query").paginate(
        TableName=table, KeyConditionExpression="app = :a",
        ExpressionAttributeValues={":a": {"S": app}}, ConsistentRead=True,
    ).build_full_result()["Items"]


def test_the_fixtures_are_of_the_formats_they_are_named_after():
    for version in FORMATS:
        data = fixture(version)
        assert data["format"] == version
        meta = next(i for i in data["items"] if i["key"]["S"] == "meta")
        assert meta["formatVersion"] == {"N": str(version)}
    # each format's new kind of item, and only there
    assert sort_keys(fixture(1)["items"], "shard#") and not sort_keys(fixture(1)["items"], "shards#")
    assert sort_keys(fixture(2)["items"], "shards#") and not sort_keys(fixture(2)["items"], "initial#")
    assert sort_keys(fixture(3)["items"], "initial#") and not sort_keys(fixture(3)["items"], "log#")
    assert sort_keys(fixture(4)["items"], "log#")


@pytest.mark.parametrize("version", FORMATS)
def test_the_current_store_reads_every_format_as_written(ddb, table, version):
    data = load(ddb, table, version)
    want = data["expect"]
    snap = CheckpointStore(ddb, table, data["app"]).snapshot()
    assert snap.positions() == positions(want["positions"])
    meta = snap.meta
    assert meta.resolved == Offset(positions(want["initial"]))
    assert meta.initial_spec == want["initial_spec"]
    assert dict(meta.streams) == want["streams"]
    assert (meta.epoch, meta.owner, meta.owner_host) == (
        want["epoch"], want["owner"], want["owner_host"],
    )
    assert meta.format_version == version
    # the owner and epoch of each shard's last commit are kept too (an AFTER:7 committed in
    # the first epoch and never since)
    assert snap.shards[ShardId("clicks.v2", "shardId-000000000000")].epoch == 1
    assert snap.shards[ShardId("clicks.v2", "shardId-000000000000")].owner == "golden-owner-1"
    assert snap.shards[ShardId("orders", "shardId-000000000000")].owner == "golden-owner-2"


# One commit after the upgrade: a 9-digit position moves on, a shard ends, a new child starts.
ADVANCE = {
    "clicks.v2/shardId-000000000000": "AFTER:100000000",
    "orders/shardId-000000000003": "SHARD_END",
    "orders/shardId-000000000005": "AT:49590338271490256608559692538361571095921575989136700000",
}


@pytest.mark.parametrize("version", FORMATS)
def test_a_current_claim_and_commit_carry_every_format_forward(ddb, table, version):
    """As the committer does on its first batch: claim, read, migrate format-1 items, commit.
    Every old position stays, the new ones are added, the initial positions are unchanged, and
    the positions end up in exactly the bucket items format 2's release wrote for these shards
    (plus the new child's)."""
    data = load(ddb, table, version)
    want = data["expect"]
    store = CheckpointStore(ddb, table, data["app"])
    epoch = store.claim("current-owner", "current-host").epoch
    assert epoch == want["epoch"] + 1
    snap = store.snapshot()
    if snap.legacy:
        assert version == 1
        # a write per bucket, then one transaction deleting format 1's items
        assert store.migrate(epoch) == len({bucket_key(k) for k in snap.shards}) + 1
    store.commit(epoch, "current-owner", positions(ADVANCE))
    store.compact(epoch)  # as a commit does once the log's ring is full

    expected = positions({**want["positions"], **ADVANCE})
    again = CheckpointStore(ddb, table, data["app"]).snapshot()  # a restarted query
    assert again.positions() == expected
    assert again.legacy == frozenset()
    assert again.meta.resolved == Offset(positions(want["initial"]))
    assert again.meta.initial_spec == want["initial_spec"]
    assert again.meta.format_version == FORMAT_VERSION
    untouched = ShardId("orders", "shardId-000000000001")
    assert again.shards[untouched].owner == "golden-owner-2"  # a shard's history is kept

    items = stored_items(ddb, table, data["app"])
    assert not sort_keys(items, "shard#")  # format 1's items are gone
    format2 = sort_keys(fixture(2)["items"], "shards#")
    new_child = {"shards#32"}  # orders/shardId-000000000005's bucket
    assert sort_keys(items, "shards#") == format2 | new_child
    if version >= 3:
        assert sort_keys(items, "initial#") == sort_keys(data["items"], "initial#")
    # each bucket holds exactly the shards format 2's release put there
    by_bucket = {
        i["key"]["S"]: bucket_shards(i)
        for i in fixture(2)["items"] if i["key"]["S"].startswith("shards#")
    }
    by_bucket["shards#32"] = {"orders/shardId-000000000005"}
    assert {
        i["key"]["S"]: bucket_shards(i)
        for i in items if i["key"]["S"].startswith("shards#")
    } == by_bucket
