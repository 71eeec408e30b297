"""A KCL application switches to kinesis-ddb without re-reading or skipping data."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from tests.support.aggregates import aggregate
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
         "--endpoint-url", source_options["dynamodbEndpointUrl"], "--region", "us-east-1"],
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
