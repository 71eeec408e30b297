"""The DynamoDB checkpoint store over HTTP against a moto server."""

from __future__ import annotations

import uuid

import pytest

from kinesis_source.checkpoints import (
    CheckpointError,
    CheckpointFencedError,
    CheckpointStore,
    CheckpointTableError,
)
from kinesis_source.positions import Offset, Position

SEQ = "49590338271490256608559692538361571095921575989136588898"


@pytest.fixture
def store(ddb):
    s = CheckpointStore(ddb, "kinesis_ddb_checkpoints", f"app-{uuid.uuid4().hex[:8]}")
    s.ensure_table(create=True)
    return s


def test_claim_bumps_the_epoch_and_records_the_owner(store):
    first = store.claim("owner-1", "host-a")
    second = store.claim("owner-2", "host-b")
    assert second.epoch == first.epoch + 1
    meta = store.snapshot().meta
    assert (meta.owner, meta.owner_host, meta.epoch) == ("owner-2", "host-b", second.epoch)


def test_commit_and_snapshot_round_trip_56_digit_positions(store):
    epoch = store.claim("o", "h").epoch
    positions = {"s/shardId-0": Position.after(SEQ), "s/shardId-1": Position.shard_end(), "t/shardId-0": Position.after("7", 2)}
    assert store.commit(epoch, "o", positions) == 1
    snap = store.snapshot()
    assert snap.positions() == positions
    assert {s.epoch for s in snap.shards.values()} == {epoch}


def test_a_position_never_moves_backwards(store):
    epoch = store.claim("o", "h").epoch
    store.commit(epoch, "o", {"s/a": Position.after("100")})
    store.commit(epoch, "o", {"s/a": Position.after("100")})  # same again is fine
    with pytest.raises(CheckpointError) as err:
        store.commit(epoch, "o", {"s/a": Position.after("99")})
    assert "Refused to move shard(s) s/a" in str(err.value) and store.app in str(err.value)
    assert store.snapshot().positions() == {"s/a": Position.after("100")}
    # integer order, not string order: "1000" is ahead of "999"
    store.commit(epoch, "o", {"s/a": Position.after("1000")})
    with pytest.raises(CheckpointError):
        store.commit(epoch, "o", {"s/a": Position.after("999")})


def test_an_older_epoch_is_fenced_naming_the_new_owner(store):
    old = store.claim("old-owner", "host-a").epoch
    store.commit(old, "old-owner", {"s/a": Position.after("1")})
    store.claim("new-owner", "host-b")
    with pytest.raises(CheckpointFencedError) as err:
        store.commit(old, "old-owner", {"s/a": Position.after("2")})
    message = str(err.value)
    assert store.app in message and store.table in message
    assert "new-owner" in message and "host-b" in message
    assert store.snapshot().positions() == {"s/a": Position.after("1")}


def test_many_shards_commit_in_chunks_of_100_items(store):
    epoch = store.claim("o", "h").epoch
    positions = {f"s/shardId-{i:012d}": Position.after(str(1000 + i)) for i in range(250)}
    assert store.commit(epoch, "o", positions) == 3  # 99 puts + the epoch check per call
    assert store.snapshot().positions() == positions


def test_initial_position_is_stored_once_resolved(store):
    epoch = store.claim("o", "h").epoch
    resolved = Offset({"s/a": Position.after("5"), "s/b": Position.trim_horizon()})
    store.save_initial(epoch, "LATEST", resolved, {"s": "2026-01-01T00:00:00.000+00:00"})
    meta = store.snapshot().meta
    assert meta.initial_spec == "LATEST" and meta.resolved == resolved
    assert meta.streams == {"s": "2026-01-01T00:00:00.000+00:00"}


def test_reset_fences_forgets_positions_and_stores_the_new_start(store):
    epoch = store.claim("o", "h").epoch
    store.commit(epoch, "o", {"s/a": Position.after("5")})
    store.save_initial(epoch, "TRIM_HORIZON", Offset({"s/a": Position.trim_horizon()}), {"s": "t0"})
    store.reset("LATEST", by="tester")
    snap = store.snapshot()
    assert snap.shards == {} and snap.meta.initial_spec == "LATEST" and snap.meta.resolved is None
    assert snap.meta.streams == {}  # a reset accepts a re-created stream
    with pytest.raises(CheckpointFencedError):
        store.commit(epoch, "o", {"s/a": Position.after("6")})


def test_missing_table_without_create_is_named(ddb):
    store = CheckpointStore(ddb, f"missing-{uuid.uuid4().hex[:6]}", "app")
    with pytest.raises(CheckpointTableError) as err:
        store.ensure_table(create=False)
    assert store.table in str(err.value) and "createTable" in str(err.value)


def test_table_with_the_wrong_key_schema_is_named(ddb):
    name = f"wrong-{uuid.uuid4().hex[:6]}"
    ddb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    with pytest.raises(CheckpointTableError) as err:
        CheckpointStore(ddb, name, "app").ensure_table(create=True)
    assert f"'{name}'" in str(err.value) and "checkpointTable" in str(err.value)
