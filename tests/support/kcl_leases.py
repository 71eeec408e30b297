"""Lease-table items exactly as KCL writes them (``DynamoDBLeaseSerializer``,
``DynamoDBMultiStreamLeaseSerializer``, KCL 3.5's single-table entities), for the import tests."""

from __future__ import annotations

ACCOUNT = "123456789012"


def v2_lease(shard: str, checkpoint: str, sub: int = 0, parents: tuple[str, ...] = ()) -> dict:
    """A KCL 2.x lease: no entityType, no hash range."""
    item = {
        "leaseKey": {"S": shard},
        "leaseCounter": {"N": "42"},
        "leaseOwner": {"S": "worker-1"},
        "ownerSwitchesSinceCheckpoint": {"N": "0"},
        "checkpoint": {"S": checkpoint},
        "checkpointSubSequenceNumber": {"N": str(sub)},
    }
    if parents:
        item["parentShardId"] = {"SS": list(parents)}
    return item


def v3_lease(shard: str, checkpoint: str, sub: int = 0, parents: tuple[str, ...] = (),
             stream: str | None = None, epoch: int | None = None) -> dict:
    """A KCL 3.5 lease (multi-stream when ``stream`` is given: key account:stream:epoch:shard)."""
    item = {
        **v2_lease(shard, checkpoint, sub, parents),
        "startingHashKey": {"S": "0"},
        "endingHashKey": {"S": str(2**128 - 1)},
        "throughputKBps": {"N": "12.5"},
        "checkpointOwner": {"S": "worker-1"},
        "entityType": {"S": "LEASE"},
    }
    if stream is not None:
        stream_id = f"{ACCOUNT}:{stream}:{epoch}"
        item.update(leaseKey={"S": f"{stream_id}:{shard}"}, streamName={"S": stream_id},
                    shardId={"S": shard})
    return item


def kcl35_other_entities() -> list[dict]:
    """What KCL 3.5 keeps beside the leases in a single-table layout, plus a lock row of a
    release that wrote no entityType."""
    return [
        {"leaseKey": {"S": "Leader"}, "entityType": {"S": "LEADER"}, "ownerName": {"S": "worker-1"},
         "leaseDuration": {"S": "10000"}, "recordVersionNumber": {"S": "abc"}},
        {"leaseKey": {"S": "worker-1"}, "entityType": {"S": "WORKER_METRIC_STATS"},
         "lastUpdateTime": {"N": "1760000000"}},
        {"leaseKey": {"S": "TableMigration3.5"}, "entityType": {"S": "TABLE_MIGRATION"},
         "status": {"S": "TABLE_MIGRATION_STATUS_COMPLETE"}},
        {"leaseKey": {"S": f"{ACCOUNT}:orders:1700000000"}, "entityType": {"S": "STREAM"}},
        {"leaseKey": {"S": "Lock"}, "ownerName": {"S": "worker-2"}},
    ]
