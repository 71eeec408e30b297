"""A KCL application switches to kinesis-ddb without re-reading or skipping data."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from tests.support.aggregates import aggregate
from tests.support.kcl_leases import kcl35_other_entities, v3_lease
from tests.support.producer import Producer
from tests.support.spark_query import running
from tests.support.waiting import wait_for

pytestmark = pytest.mark.spark


def make_lease_table(ddb, leases):
    """A lease table as KCL 2.x writes it: leaseKey (shard id), checkpoint, sub-sequence."""
    name = f"kcl-leases-{uuid.uuid4().hex[:6]}"
    ddb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    for shard, checkpoint, sub in leases:
        ddb.put_item(
            TableName=name,
            Item={
                "leaseKey": {"S": shard},
                "checkpoint": {"S": checkpoint},
                "checkpointSubSequenceNumber": {"N": str(sub)},
                "leaseCounter": {"N": "42"},
                "leaseOwner": {"S": "kcl-worker-1"},
                "ownerSwitchesSinceCheckpoint": {"N": "0"},
            },
        )
    return name


def put_items(ddb, items):
    """A lease table holding ``items`` as they are."""
    name = f"kcl35-leases-{uuid.uuid4().hex[:6]}"
    ddb.create_table(TableName=name, KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
                     AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
                     BillingMode="PAY_PER_REQUEST")
    for item in items:
        ddb.put_item(TableName=name, Item=item)
    return name


def import_kcl(source_options, app, table, *extra):
    return subprocess.run(
        [sys.executable, "-m", "kinesis_source.tools.cli", "checkpoints", "import-kcl", "--app", app,
         "--lease-table", table, "--yes", "--endpoint-url", source_options["dynamodbEndpointUrl"],
         "--kinesis-endpoint-url", source_options["endpointUrl"], "--region", "us-east-1", *extra],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
    )


def test_import_of_a_kcl_3_5_multi_stream_table_skips_other_entities_and_resumes_after_its_leases(
    spark, kinesis, ddb, make_stream, source_options, tmp_path
):
    stream = make_stream(2)
    sent = Producer(kinesis, stream).put(60)
    created = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]
    epoch = int(created["StreamCreationTimestamp"].timestamp())
    by_shard = {s: [p for p in sent if p.shard_id == s] for s in sorted({p.shard_id for p in sent})}
    leases = [v3_lease(shard, records[9].seq, stream=stream, epoch=epoch) for shard, records in by_shard.items()]
    table = put_items(ddb, [*leases, *kcl35_other_entities(),
                            v3_lease("shardId-000000000000", "1", stream="another", epoch=epoch)])
    app = source_options["applicationName"]

    refused = import_kcl(source_options, app, table, "--stream", stream.replace("-", "_") + "x")
    assert refused.returncode == 1 and "has no leases of stream(s)" in refused.stderr, refused.stderr

    proc = import_kcl(source_options, app, table, "--stream", stream)
    assert proc.returncode == 0, proc.stderr
    assert "4 item(s) (entityType" not in proc.stderr  # counted per type
    for why in ("entityType LEADER", "entityType WORKER_METRIC_STATS", "entityType TABLE_MIGRATION",
                "entityType STREAM", "no checkpoint", "other stream"):
        assert f"1 item(s) ({why})" in proc.stderr, proc.stderr
    expected = {(p.shard_id, p.seq) for records in by_shard.values() for p in records[10:]}
    with running(spark, {**source_options, "streamName": stream}, tmp_path / "ck") as (_, sink):
        wait_for(lambda: sink.count() >= len(expected), timeout=90, what="the records after the leases")
    got = [(r.shard_id, r.seq) for r in sink.rows()]
    assert len(got) == len(set(got)) and set(got) == expected


def test_import_refuses_leases_of_a_re_created_stream(kinesis, ddb, make_stream, source_options):
    stream = make_stream(1)
    created = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]
    epoch = int(created["StreamCreationTimestamp"].timestamp()) - 86400  # the old stream's
    table = put_items(ddb, [v3_lease("shardId-000000000000", "5", stream=stream, epoch=epoch)])
    app = source_options["applicationName"]
    proc = import_kcl(source_options, app, table)
    assert proc.returncode == 1 and "deleted and re-created" in proc.stderr, proc.stderr
    rows = ddb.query(TableName="kinesis_ddb_checkpoints", KeyConditionExpression="app = :a",
                     ExpressionAttributeValues={":a": {"S": app}})["Items"]
    assert rows == []


def test_import_kcl_resumes_exactly_after_the_kcl_checkpoints(
    spark, kinesis, ddb, make_stream, source_options, tmp_path
):
    stream = make_stream(2)
    sent = Producer(kinesis, stream).put(100)
    a, b = sorted({p.shard_id for p in sent})
    in_a = [p for p in sent if p.shard_id == a]
    in_b = [p for p in sent if p.shard_id == b]
    # an aggregate in shard b, of which KCL had processed user records 0..2; its user records
    # carry b's hash key too, or the source (like KCL) would drop them as not b's
    users = [("u", f"agg-{i}".encode(), str(2**127 + 1)) for i in range(6)]
    key, data = aggregate(users)
    resp = kinesis.put_record(StreamName=stream, PartitionKey=key, Data=data, ExplicitHashKey=str(2**127 + 1))
    assert resp["ShardId"] == b
    agg_seq = resp["SequenceNumber"]
    later = Producer(kinesis, stream, tag="later").put(40)
    leases = make_lease_table(ddb, [(a, in_a[29].seq, 0), (b, agg_seq, 2)])
    app = source_options["applicationName"]
    proc = subprocess.run(
        [sys.executable, "-m", "kinesis_source.tools.cli", "checkpoints", "import-kcl", "--app", app,
         "--lease-table", leases, "--stream", stream, "--yes",
         "--endpoint-url", source_options["dynamodbEndpointUrl"],
         "--kinesis-endpoint-url", source_options["endpointUrl"], "--region", "us-east-1"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    expected = {(p.shard_id, p.seq, 0, p.data) for p in in_a[30:] + later}
    expected |= {(b, agg_seq, i, d) for i, (_, d, _) in enumerate(users) if i > 2}
    with running(spark, {**source_options, "streamName": stream}, tmp_path / "ck") as (_, sink):
        wait_for(lambda: sink.count() >= len(expected), timeout=90, what="the records after KCL's")
    got = [(r.shard_id, r.seq, r.sub_seq, r.data) for r in sink.rows()]
    assert len(got) == len(set(got))
    assert set(got) == expected, "re-read or skipped records around the KCL checkpoints"
    # nothing of shard b before KCL's checkpoint (moto repeats sequence numbers across shards)
    assert not {(b, p.seq) for p in in_b} & {(r.shard_id, r.seq) for r in sink.rows()}
