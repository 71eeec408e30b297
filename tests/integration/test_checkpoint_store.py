"""The DynamoDB checkpoint store over HTTP against a moto server."""

from __future__ import annotations

import json
import uuid

import pytest

from kinesis_source.checkpoints import format as checkpoint_format
from kinesis_source.checkpoints import store as checkpoint_store
from kinesis_source.checkpoints.format import (
    FORMAT_VERSION,
    bucket_key,
    initial_bucket_key,
    item_key,
    order_key,
)
from kinesis_source.checkpoints.store import CheckpointStore
from kinesis_source.errors import (
    CheckpointError,
    CheckpointFencedError,
    CheckpointTableError,
)
from kinesis_source.option_values import parse_initial_position
from kinesis_source.positions import Offset, Position, ShardId
from tests.support.cli import cli

SEQ = "49590338271490256608559692538361571095921575989136588898"


def sid(shard, stream="s"):
    """Shard ``shard`` of stream ``s`` (or of ``stream``)."""
    return ShardId(stream, shard)


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
    positions = {
        sid("shardId-0"): Position.after(SEQ),
        sid("shardId-1"): Position.shard_end(),
        sid("shardId-0", "t"): Position.after("7", 2),
    }
    assert store.commit(epoch, "o", positions) == 1
    snap = store.snapshot()
    assert snap.positions() == positions
    assert {s.epoch for s in snap.shards.values()} == {epoch}


def test_a_position_never_moves_backwards(store):
    epoch = store.claim("o", "h").epoch
    store.commit(epoch, "o", {sid("a"): Position.after("100")})
    store.commit(epoch, "o", {sid("a"): Position.after("100")})  # same again is fine
    with pytest.raises(CheckpointError) as err:
        store.commit(epoch, "o", {sid("a"): Position.after("99")})
    assert "Refused to move shard(s) s/a" in str(err.value) and store.app in str(err.value)
    assert store.snapshot().positions() == {sid("a"): Position.after("100")}
    # integer order, not string order: "1000" is ahead of "999"
    store.commit(epoch, "o", {sid("a"): Position.after("1000")})
    with pytest.raises(CheckpointError):
        store.commit(epoch, "o", {sid("a"): Position.after("999")})


def test_an_older_epoch_is_fenced_naming_the_new_owner(store):
    old = store.claim("old-owner", "host-a").epoch
    store.commit(old, "old-owner", {sid("a"): Position.after("1")})
    store.claim("new-owner", "host-b")
    with pytest.raises(CheckpointFencedError) as err:
        store.commit(old, "old-owner", {sid("a"): Position.after("2")})
    message = str(err.value)
    assert store.app in message and store.table in message
    assert "new-owner" in message and "host-b" in message
    assert store.snapshot().positions() == {sid("a"): Position.after("1")}


def transactions(store):
    """The item count of every TransactWriteItems the store's client sends from now on."""
    sizes = []

    def seen(params, **_):
        sizes.append(len(params["TransactItems"]))

    store.client.meta.events.register("provide-client-params.dynamodb.TransactWriteItems", seen)
    return sizes


def test_a_thousand_positions_commit_in_one_call_and_one_shard_writes_one_small_item(store):
    epoch = store.claim("o", "h").epoch
    sent = transactions(store)
    positions = {sid(f"shardId-{i:012d}"): Position.after(str(1000 + i)) for i in range(1000)}
    assert store.commit(epoch, "o", positions) == 1
    assert sent == [2]  # the epoch check + one log entry holding every position
    one = sid("shardId-000000000007")
    assert store.commit(epoch, "o", {one: Position.after("5000")}) == 1
    assert sent[-1] == 2
    # DynamoDB's sizing: the check (a meta item under 1 KB) and an entry under 1 KB, twice each
    # as a transaction's, not a bucket of 16 shards
    assert store.writer.last_commit_units == 4
    assert store.commit(epoch, "o", {one: Position.after("5000")}) == 0  # unchanged: no call
    assert store.snapshot().positions() == {**positions, one: Position.after("5000")}
    # a new store (a restarted query) reads it all back
    assert CheckpointStore(store.client, store.table, store.app).snapshot().positions() == {
        **positions, one: Position.after("5000")
    }


def test_forgotten_finished_shards_leave_the_table_in_the_commit_that_names_them(store):
    epoch = store.claim("o", "h").epoch
    parent, child, live = sid("shardId-000000000001"), sid("shardId-000000000004"), sid("shardId-000000000002")
    store.commit(epoch, "o", {
        parent: Position.shard_end(), child: Position.after("10"), live: Position.after("20"),
    })
    sent = transactions(store)
    # ``live`` is not at SHARD_END: it is kept even if named
    assert store.commit(epoch, "o", {child: Position.after("11")}, forget=[parent, live]) == 1
    assert sent == [2]  # the check + one log entry (the child's position, the parent dropped)
    want = {child: Position.after("11"), live: Position.after("20")}
    assert store.snapshot().positions() == want
    assert CheckpointStore(store.client, store.table, store.app).snapshot().positions() == want
    # forgetting alone is a write of its own; forgetting what is gone is none
    store.commit(epoch, "o", {sid("shardId-000000000009"): Position.shard_end()})
    assert store.commit(epoch, "o", {}, forget=[sid("shardId-000000000009")]) == 1
    assert store.commit(epoch, "o", {}, forget=[sid("shardId-000000000009"), parent]) == 0
    assert store.snapshot().positions() == want


def test_forgetting_is_fenced_like_any_commit(store):
    epoch = store.claim("o", "h").epoch
    store.commit(epoch, "o", {sid("p"): Position.shard_end()})
    store.claim("other", "h2")
    with pytest.raises(CheckpointFencedError):
        store.commit(epoch, "o", {}, forget=[sid("p")])
    assert store.snapshot().positions() == {sid("p"): Position.shard_end()}


def put_format_1(store, epoch, rows):
    """Items as kinesis-ddb 0.1 (checkpoint format 1) wrote them: one per shard."""
    store.client.put_item(TableName=store.table, Item={
        "app": {"S": store.app}, "key": {"S": "meta"}, "epoch": {"N": str(epoch)},
        "owner": {"S": "old"}, "formatVersion": {"N": "1"},
    })
    for key, pos in rows.items():
        store.client.put_item(TableName=store.table, Item={
            "app": {"S": store.app}, "key": {"S": item_key(key)}, "position": {"S": pos.to_str()},
            "order": {"S": order_key(pos)}, "epoch": {"N": str(epoch)}, "owner": {"S": "old"},
            "committedAt": {"S": "2026-01-01T00:00:00.000+00:00"},
        })


def test_format_1_items_are_read_then_migrated_into_buckets(store):
    rows = {sid(f"shardId-{i}"): Position.after(str(10 + i)) for i in range(30)}
    rows[sid("shardId-99")] = Position.shard_end()
    put_format_1(store, 4, rows)
    snap = store.snapshot()
    assert snap.positions() == rows and snap.meta.format_version == 1
    assert snap.legacy == {item_key(k) for k in rows}
    assert snap.shards[sid("shardId-3")].owner == "old"
    epoch = store.claim("new", "h").epoch
    assert epoch == 5 and store.snapshot().meta.format_version == FORMAT_VERSION
    # a conditional write per bucket, then the old items deleted in a fenced transaction
    assert store.migrate(epoch) == len({bucket_key(k) for k in rows}) + 1
    after = store.snapshot()
    assert after.positions() == rows and after.legacy == frozenset()
    assert after.shards[sid("shardId-3")].owner == "old"  # a shard's history is kept
    keys = {i["key"]["S"] for i in store.client.query(
        TableName=store.table, KeyConditionExpression="app = :a",
        ExpressionAttributeValues={":a": {"S": store.app}})["Items"]}
    assert not any(k.startswith("shard#") for k in keys)
    assert store.migrate(epoch) == 0
    store.commit(epoch, "new", {sid("shardId-3"): Position.after("100")})
    assert store.snapshot().positions()[sid("shardId-3")] == Position.after("100")


def test_a_migration_cut_short_keeps_the_further_position(store):
    epoch = store.claim("o", "h").epoch
    store.commit(epoch, "o", {sid("a"): Position.after("50"), sid("b"): Position.after("50")})
    put_format_1(store, epoch, {sid("a"): Position.after("70"), sid("b"): Position.after("20")})
    positions = CheckpointStore(store.client, store.table, store.app).snapshot().positions()
    assert positions == {sid("a"): Position.after("70"), sid("b"): Position.after("50")}


def test_a_newer_format_is_refused_and_left_as_it_is(store):
    store.claim("o", "h")
    store.client.update_item(
        TableName=store.table, Key={"app": {"S": store.app}, "key": {"S": "meta"}},
        UpdateExpression="SET formatVersion = :v",
        ExpressionAttributeValues={":v": {"N": str(FORMAT_VERSION + 1)}},
    )
    for call in (lambda: store.claim("o2", "h"), store.snapshot):
        with pytest.raises(CheckpointError) as err:
            call()
        assert "upgrade kinesis-ddb" in str(err.value) and store.app in str(err.value)
    meta = store.snapshot_meta()
    assert meta.format_version == FORMAT_VERSION + 1 and meta.owner == "o"


def test_a_second_writer_under_the_same_epoch_is_refused_not_lost(store):
    epoch = store.claim("o", "h").epoch
    first = sid("a")
    second = next(sid(f"x{i}") for i in range(1000) if bucket_key(sid(f"x{i}")) == bucket_key(first))
    other = CheckpointStore(store.client, store.table, store.app)
    other.snapshot()
    store.commit(epoch, "o", {first: Position.after("1")})
    with pytest.raises(CheckpointError) as err:
        other.commit(epoch, "o", {second: Position.after("2")})  # would drop `first`
    assert "log#00" in str(err.value) and "nothing was written" in str(err.value)
    assert store.snapshot().positions() == {first: Position.after("1")}
    other.commit(epoch, "o", {second: Position.after("2")})  # re-reads, then keeps both
    assert store.snapshot().positions() == {first: Position.after("1"), second: Position.after("2")}


def test_initial_position_is_stored_once_resolved(store):
    epoch = store.claim("o", "h").epoch
    resolved = Offset({sid("a"): Position.after("5"), sid("b"): Position.trim_horizon()})
    store.save_initial(epoch, "LATEST", resolved, {"s": "2026-01-01T00:00:00.000+00:00"})
    meta = store.snapshot().meta
    assert meta.initial_spec == "LATEST" and meta.resolved == resolved
    assert meta.streams == {"s": "2026-01-01T00:00:00.000+00:00"}


def many_resolved(n):
    """Initial positions as LATEST resolves them over n shards: after each tip, or at
    TRIM_HORIZON for an empty shard."""
    return Offset({
        sid(f"shardId-{i:012d}"): (
            Position.trim_horizon() if i % 10 == 0 else Position.after(f"{SEQ[:-6]}{i:06d}")
        )
        for i in range(n)
    })


def sort_keys(store, prefix):
    items = store.client.get_paginator("query").paginate(
        TableName=store.table, KeyConditionExpression="app = :a",
        ExpressionAttributeValues={":a": {"S": store.app}},
    ).build_full_result()["Items"]
    return {i["key"]["S"] for i in items if i["key"]["S"].startswith(prefix)}


def reread(store):
    """What a restarted query's new store reads."""
    return CheckpointStore(store.client, store.table, store.app).snapshot()


def raw_meta(store):
    return store.client.get_item(
        TableName=store.table, Key={"app": {"S": store.app}, "key": {"S": "meta"}},
        ConsistentRead=True,
    )["Item"]


def test_5000_initial_positions_are_stored_in_buckets_and_read_back_whole(store):
    epoch = store.claim("o", "h").epoch
    resolved = many_resolved(5000)  # 425 KB as one offset: over DynamoDB's item limit
    sent = transactions(store)
    store.save_initial(epoch, "LATEST", resolved, {"s": "t0"})
    assert len(sent) == 1  # the meta update and every bucket in one transaction
    meta = reread(store).meta
    assert meta.resolved == resolved and meta.initial_spec == "LATEST"
    assert meta.streams == {"s": "t0"}
    assert "resolved" not in raw_meta(store)
    assert sort_keys(store, "initial#") == {initial_bucket_key(k) for k in resolved.shards}
    # saving again replaces the set completely: buckets left empty are deleted
    fewer = Offset({k: resolved.shards[k] for k in list(resolved.shards)[:3]})
    store.save_initial(epoch, "TRIM_HORIZON", fewer, {"s": "t0"})
    assert reread(store).meta.resolved == fewer
    assert sort_keys(store, "initial#") == {initial_bucket_key(k) for k in fewer.shards}


def test_initial_positions_too_large_for_an_item_are_refused_naming_what_to_do(store):
    epoch = store.claim("o", "h").epoch
    bucket = initial_bucket_key(sid("k0"))
    keys = []
    i = 0
    while len(keys) < 5200:  # about 400 KB in one bucket
        if initial_bucket_key(sid(f"k{i}")) == bucket:
            keys.append(sid(f"k{i}"))
        i += 1
    with pytest.raises(CheckpointError) as err:
        store.save_initial(epoch, "LATEST", Offset({k: Position.after(SEQ) for k in keys}), {})
    message = str(err.value)
    assert store.app in message and store.table in message and "applicationName" in message
    assert store.snapshot().meta.resolved is None and sort_keys(store, "initial#") == set()


def test_saving_initial_positions_is_fenced(store):
    epoch = store.claim("o", "h").epoch
    store.claim("other", "h2")
    with pytest.raises(CheckpointFencedError):
        store.save_initial(epoch, "LATEST", many_resolved(10), {"s": "t0"})
    assert store.snapshot().meta.resolved is None and sort_keys(store, "initial#") == set()


def test_a_save_cut_short_between_transactions_is_not_read(store, monkeypatch):
    epoch = store.claim("o", "h").epoch
    monkeypatch.setattr(checkpoint_format, "MAX_TRANSACT_BYTES", 50_000)  # ~10 transactions
    calls = []

    def fail_the_third(**_):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("driver died")

    event = "before-call.dynamodb.TransactWriteItems"
    store.client.meta.events.register(event, fail_the_third)
    try:
        with pytest.raises(RuntimeError):
            store.save_initial(epoch, "LATEST", many_resolved(5000), {"s": "t0"})
    finally:
        store.client.meta.events.unregister(event, fail_the_third)
    assert sort_keys(store, "initial#")  # two transactions' worth were written ...
    assert store.snapshot().meta.resolved is None  # ... and are not in force
    resolved = many_resolved(40)
    store.save_initial(epoch, "LATEST", resolved, {"s": "t0"})
    assert reread(store).meta.resolved == resolved
    assert sort_keys(store, "initial#") == {initial_bucket_key(k) for k in resolved.shards}


def test_reset_deletes_the_stored_initial_positions(store):
    epoch = store.claim("o", "h").epoch
    store.commit(epoch, "o", {sid("shardId-000000000001"): Position.after("5")})
    store.save_initial(epoch, "LATEST", many_resolved(5000), {"s": "t0"})
    store.reset("TRIM_HORIZON", by="tester")
    snap = reread(store)
    assert snap.meta.resolved is None and snap.shards == {}
    assert snap.meta.initial_spec == "TRIM_HORIZON"
    assert sort_keys(store, "initial#") == set() and sort_keys(store, "shards#") == set()
    assert sort_keys(store, "log#") == set()


def test_export_and_reset_of_the_cli_see_all_5000_initial_positions(store, tmp_path):
    epoch = store.claim("o", "h").epoch
    resolved = many_resolved(5000)
    store.save_initial(epoch, "LATEST", resolved, {"s": "t0"})
    committed = {sid("shardId-000000000001"): Position.after("5"), sid("new"): Position.shard_end()}
    store.commit(epoch, "o", committed)
    where = ["--app", store.app, "--table", store.table]
    where += ["--endpoint-url", store.client.meta.endpoint_url]
    exported = tmp_path / "positions.json"
    cli("checkpoints", "export", *where, "-o", str(exported))
    want = {str(k): p.to_str() for k, p in {**resolved.shards, **committed}.items()}
    assert json.loads(exported.read_text()) == want
    cli("checkpoints", "reset", *where, "--to", "TRIM_HORIZON", "--yes")
    snap = reread(store)
    assert snap.meta.resolved is None and snap.shards == {}
    assert snap.meta.initial_spec == "TRIM_HORIZON" and sort_keys(store, "initial#") == set()


def put_format_2_meta(store, epoch, resolved):
    """The meta item as kinesis-ddb with checkpoint format 2 wrote it: the initial positions
    inline, as one offset JSON."""
    store.client.put_item(TableName=store.table, Item={
        "app": {"S": store.app}, "key": {"S": "meta"}, "epoch": {"N": str(epoch)},
        "owner": {"S": "old"}, "ownerHost": {"S": "old-host"}, "formatVersion": {"N": "2"},
        "initialSpec": {"S": "LATEST"}, "resolved": {"S": resolved.to_json()},
        "streams": {"S": '{"s": "t0"}'},
    })


def test_format_2_inline_initial_positions_are_still_read(store):
    inline = many_resolved(50)
    put_format_2_meta(store, 6, inline)
    assert store.snapshot().meta.resolved == inline
    epoch = store.claim("new", "h").epoch
    assert epoch == 7
    snap = reread(store)
    assert snap.meta.resolved == inline and snap.meta.format_version == FORMAT_VERSION
    assert snap.meta.initial_spec == "LATEST" and snap.meta.streams == {"s": "t0"}
    # once saved in buckets, the buckets are read, even next to an inline offset
    bucketed = many_resolved(5)
    store.save_initial(epoch, "TRIM_HORIZON", bucketed, {"s": "t0"})
    store.client.update_item(
        TableName=store.table, Key={"app": {"S": store.app}, "key": {"S": "meta"}},
        UpdateExpression="SET resolved = :r",
        ExpressionAttributeValues={":r": {"S": inline.to_json()}},
    )
    assert reread(store).meta.resolved == bucketed


def test_the_previous_format_refuses_an_application_written_in_format_4(store, monkeypatch):
    assert FORMAT_VERSION == 4
    epoch = store.claim("o", "h").epoch
    store.save_initial(epoch, "LATEST", many_resolved(10), {"s": "t0"})
    monkeypatch.setattr(checkpoint_store, "FORMAT_VERSION", 3)  # the release before this one
    old = CheckpointStore(store.client, store.table, store.app)
    with pytest.raises(CheckpointError) as err:
        old.claim("old", "h2")
    assert "format 4" in str(err.value) and "upgrade kinesis-ddb" in str(err.value)
    meta = old.snapshot_meta()
    assert (meta.epoch, meta.owner, meta.format_version) == (epoch, "o", 4)


def test_reset_fences_forgets_positions_and_stores_the_new_start(store):
    epoch = store.claim("o", "h").epoch
    store.commit(epoch, "o", {sid("a"): Position.after("5")})
    store.save_initial(epoch, "TRIM_HORIZON", Offset({sid("a"): Position.trim_horizon()}), {"s": "t0"})
    store.reset("LATEST", by="tester")
    snap = store.snapshot()
    assert snap.shards == {} and snap.meta.initial_spec == "LATEST" and snap.meta.resolved is None
    assert snap.meta.streams == {}  # a reset accepts a re-created stream
    with pytest.raises(CheckpointFencedError):
        store.commit(epoch, "o", {sid("a"): Position.after("6")})


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


def test_a_5000_shard_export_resets_through_the_cli_and_is_read_back_whole(store, tmp_path):
    """The per-shard spec `checkpoints export` writes for 5,000 shards is ~400 KB: stored as
    given in the meta item, `reset --to-file` failed with DynamoDB's item-size error. It goes
    to spec#NNNN items now, is read back whole, and the resolved positions saved from it do
    not need it inline."""
    epoch = store.claim("o", "h").epoch
    resolved = many_resolved(5000)
    store.save_initial(epoch, "LATEST", resolved, {"s": "t0"})
    where = ["--app", store.app, "--table", store.table]
    where += ["--endpoint-url", store.client.meta.endpoint_url]
    exported = tmp_path / "positions.json"
    cli("checkpoints", "export", *where, "-o", str(exported))
    assert len(exported.read_text()) > 300_000
    cli("checkpoints", "reset", *where, "--to-file", str(exported), "--yes")
    snap = reread(store)
    assert snap.meta.resolved is None and snap.shards == {}
    assert json.loads(snap.meta.initial_spec) == json.loads(exported.read_text())
    spec = parse_initial_position(snap.meta.initial_spec)
    assert len(spec.shards) == 5000
    # a start resolves it and stores the positions; the long spec stays readable
    epoch = store.claim("o2", "h").epoch
    store.save_initial(epoch, snap.meta.initial_spec, resolved, {"s": "t0"})
    again = reread(store)
    assert again.meta.resolved == resolved
    assert json.loads(again.meta.initial_spec) == json.loads(exported.read_text())
    # a later short reset drops the long spec's items
    cli("checkpoints", "reset", *where, "--to", "LATEST", "--yes")
    assert reread(store).meta.initial_spec == "LATEST" and sort_keys(store, "spec#") == set()


def test_the_cli_fails_at_once_on_an_endpoint_it_cannot_reach_and_names_its_flag(tmp_path):
    from kinesis_source.tools.local import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    proc = cli("checkpoints", "show", "--app", "a", "--endpoint-url", dead, "--region", "us-east-1",
               check=False)
    assert proc.returncode == 1
    assert "Could not connect to DynamoDB for application 'a'" in proc.stderr
    assert "check --endpoint-url (or --region when no endpoint is set)" in proc.stderr, proc.stderr
    assert "dynamodbEndpointUrl" not in proc.stderr and "Traceback" not in proc.stderr


def test_the_cli_names_its_flag_for_a_bad_reset_target(store):
    store.claim("o", "h")
    where = ["--app", store.app, "--table", store.table, "--endpoint-url", store.client.meta.endpoint_url]
    proc = cli("checkpoints", "reset", *where, "--to", "TRIM-HORIZON", "--yes", check=False)
    assert proc.returncode == 1
    assert "--to = 'TRIM-HORIZON' is invalid" in proc.stderr, proc.stderr
    assert "initialPosition" not in proc.stderr


def test_the_cli_lists_every_option():
    from kinesis_source.options import option_specs

    out = cli("options").stdout
    for spec in option_specs():
        assert f"| `{spec['key']}` |" in out


def test_the_cli_without_credentials_says_how_to_give_them(tmp_path):
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_EC2_METADATA_DISABLED="true")
    proc = cli("checkpoints", "show", "--app", "a", "--endpoint-url", "http://127.0.0.1:1",
               "--region", "us-east-1", check=False, env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "No AWS credentials for DynamoDB (application 'a'" in proc.stderr
    assert "use --profile, or make them available to boto3's default chain" in proc.stderr, proc.stderr
