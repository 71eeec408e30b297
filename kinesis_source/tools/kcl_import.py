"""A KCL application's lease table as kinesis-ddb positions (``checkpoints import-kcl``).

Lease items are read as KCL writes them, from 1.x to 3.5 (``DynamoDBLeaseSerializer`` and
``DynamoDBMultiStreamLeaseSerializer``): ``leaseKey``, ``checkpoint`` (a sequence number or one
of the sentinels ``TRIM_HORIZON``, ``LATEST``, ``SHARD_END``, ``AT_TIMESTAMP``),
``checkpointSubSequenceNumber``, ``parentShardId``; multi-stream leases add ``streamName``
(``account:stream:creationEpoch``) and ``shardId``, and their key is
``account:stream:creationEpoch:shardId``. KCL 3.5's single-table layout keeps other entities in
the same table (leader lock, stream info, worker metrics, migration state), told apart by
``entityType``: only ``LEASE`` rows (and rows without the attribute, which older KCLs wrote) are
leases.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kinesis_source.aws.kinesis import ShardInfo
from kinesis_source.errors import CheckpointError, OptionError
from kinesis_source.positions import ShardId, check_seq

LEASE = "LEASE"
# KCL's sentinels that are positions of ours as they are.
_SENTINELS = {"TRIM_HORIZON", "LATEST", "SHARD_END"}


@dataclass(frozen=True)
class Lease:
    """One shard's lease as KCL left it."""

    key: str
    stream: str
    shard: str
    checkpoint: str
    sub: int
    creation_epoch: int | None = None  # multi-stream leases only


def _text(item: Mapping, name: str) -> str | None:
    value = item.get(name)
    return value.get("S") if isinstance(value, dict) else None


def read_leases(items: Iterable[Mapping], streams: Sequence[str]) -> tuple[list[Lease], Counter]:
    """The leases among a lease table's items, of ``streams`` (all multi-stream ones when none
    is given), and how many items were skipped, by why."""
    leases: list[Lease] = []
    skipped: Counter = Counter()
    for item in items:
        key = _text(item, "leaseKey") or ""
        entity = _text(item, "entityType")
        if entity is not None and entity != LEASE:
            skipped[f"entityType {entity}"] += 1
            continue
        checkpoint = _text(item, "checkpoint")
        if checkpoint is None:  # a lock or bookkeeping row of a KCL that wrote no entityType
            skipped["no checkpoint"] += 1
            continue
        sub = int(item.get("checkpointSubSequenceNumber", {}).get("N", "0"))
        stream_id = _text(item, "streamName")
        parts = (stream_id.split(":") + [_text(item, "shardId") or ""]) if stream_id else key.split(":")
        if len(parts) == 4:
            _, stream, epoch, shard = parts
            if streams and stream not in streams:
                skipped["other stream"] += 1
                continue
            leases.append(Lease(key, stream, shard, checkpoint, sub, int(epoch)))
        elif len(streams) == 1:
            leases.append(Lease(key, streams[0], key, checkpoint, sub))
        else:
            raise OptionError(
                f"KCL lease '{key}' is a single-stream lease (its key is a shard id): give its "
                "stream with exactly one --stream"
            )
    return leases, skipped


def check_streams(leases: Sequence[Lease], created: Mapping[str, float]) -> None:
    """Refuse multi-stream leases whose stream was deleted and re-created since (the creation
    epoch in their key is not the stream's): their sequence numbers mean nothing in it."""
    for lease in leases:
        if lease.creation_epoch is None:
            continue
        now = int(created[lease.stream])
        if lease.creation_epoch != now:
            raise CheckpointError(
                f"KCL lease '{lease.key}' is for Kinesis stream '{lease.stream}' as created at "
                f"epoch {lease.creation_epoch}, but the stream of that name was created at epoch "
                f"{now}: it was deleted and re-created, and the lease's checkpoint means nothing "
                "in it. Import without that stream (--stream), or start it with "
                "'initialPosition' instead."
            )


def positions(
    leases: Sequence[Lease], listing: Mapping[str, Sequence[ShardInfo]], at_timestamp: str | None
) -> dict[str, str]:
    """The per-shard ``initialPosition`` JSON for ``leases``. Closed ancestors of a leased shard
    that have no lease of their own (KCL deletes a parent's lease once its children started) are
    finished: ``SHARD_END``, never read again."""
    out: dict[str, str] = {}
    for lease in leases:
        out[str(ShardId(lease.stream, lease.shard))] = _position(lease, at_timestamp)
    for stream in {lease.stream for lease in leases}:
        shards = {s.shard_id: s for s in listing.get(stream, ())}
        todo = [lease.shard for lease in leases if lease.stream == stream]
        while todo:
            shard = shards.get(todo.pop())
            for parent in (shard.parent, shard.adjacent_parent) if shard else ():
                key = str(ShardId(stream, parent)) if parent else None
                if key and key not in out and parent in shards:
                    out[key] = "SHARD_END"
                    todo.append(parent)
    return dict(sorted(out.items()))


def _position(lease: Lease, at_timestamp: str | None) -> str:
    checkpoint = lease.checkpoint
    if checkpoint in _SENTINELS:
        return checkpoint
    if checkpoint == "AT_TIMESTAMP":
        if at_timestamp is None:
            raise OptionError(
                f"KCL lease '{lease.key}' starts AT_TIMESTAMP, whose timestamp is in the KCL "
                "application's configuration, not in its lease table: give it with "
                "--at-timestamp <ISO-8601>"
            )
        return f"AT_TIMESTAMP:{at_timestamp}"
    try:
        check_seq(checkpoint)
    except ValueError:
        raise CheckpointError(
            f"KCL lease '{lease.key}' has checkpoint {checkpoint!r}: neither a sequence number nor "
            "one of TRIM_HORIZON, LATEST, SHARD_END, AT_TIMESTAMP"
        ) from None
    return f"AFTER:{checkpoint}:{lease.sub}"


def scan(client: object, table: str) -> list[dict]:
    """Every item of the lease table (a consistent scan: KCL may have just written)."""
    from botocore.exceptions import BotoCoreError, ClientError

    from kinesis_source.aws.clients import error_code
    from kinesis_source.aws.retries import is_connect_error

    try:
        pages = client.get_paginator("scan").paginate(TableName=table, ConsistentRead=True)  # type: ignore[attr-defined]
        return [item for page in pages for item in page.get("Items", [])]
    except (ClientError, BotoCoreError) as exc:
        if error_code(exc) == "ResourceNotFoundException":
            where = "check --lease-table (and --lease-region/--lease-endpoint-url)"
        elif is_connect_error(exc):
            where = "check --lease-endpoint-url (or --lease-region when no endpoint is set)"
        else:
            where = "check the credentials' dynamodb:Scan permission on it"
        raise CheckpointError(f"Could not read KCL lease table '{table}': {where}. {exc}") from None


def stream_facts(client: object, streams: Iterable[str]) -> tuple[dict[str, list[ShardInfo]], dict[str, float]]:
    """Each stream's shards (``ListShards``) and creation time in epoch seconds
    (``DescribeStreamSummary``), with a boto3 Kinesis client."""
    from kinesis_source.aws.kinesis import created_at, list_shards, stream_must_exist

    listing: dict[str, list[ShardInfo]] = {}
    created: dict[str, float] = {}
    for stream in streams:
        listing[stream] = list_shards(client, stream)
        with stream_must_exist(stream):
            summary = client.describe_stream_summary(StreamName=stream)  # type: ignore[attr-defined]
        created[stream] = created_at(summary).timestamp()
    return listing, created
