"""One application's writes to the checkpoint table: rewritten position buckets and the
stored initial positions, in ``TransactWriteItems`` calls within DynamoDB's limits, each fenced
by the epoch; and what the table holds as last read or written here (commits rewrite whole
buckets from it; fencing makes it exact: no one else writes while this epoch holds)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from botocore.exceptions import ClientError

from kinesis_source.aws.clients import error_code
from kinesis_source.checkpoints.format import (
    MAX_INLINE_SPEC,
    MAX_ITEM_BYTES,
    META_KEY,
    SPEC_CHUNK,
    SPEC_PREFIX,
    StoredShard,
    bucket_key,
    entry_of,
    initial_bucket_key,
    transactions,
)
from kinesis_source.errors import CheckpointError, CheckpointFencedError
from kinesis_source.positions import Offset, ShardId


class FencedWriter:
    """The writes of one application (``app``) in ``table``."""

    def __init__(
        self,
        client: Any,
        table: str,
        app: str,
        where: Callable[[], str],
        fenced: Callable[[int], CheckpointFencedError],
        reread: Callable[[], Any],
    ) -> None:
        self._client = client
        self.table = table
        self.app = app
        self._where = where  # names application and table in errors
        self._fenced = fenced  # the error for a lost epoch check
        self._reread = reread  # reads the table, filling the state below
        self.known: dict[ShardId, StoredShard] | None = None  # None: read before writing
        self.versions: dict[str, int] = {}  # bucket sort key -> version
        self.initial_keys: set[str] | None = None  # sort keys of the initial#NN items

    def known_shards(self) -> dict[ShardId, StoredShard]:
        """What the table holds, reading it first if nothing was read or written yet."""
        if self.known is None:
            self._reread()
        assert self.known is not None
        return self.known

    def _initial_keys_now(self) -> set[str]:
        if self.initial_keys is None:
            self._reread()
        assert self.initial_keys is not None
        return self.initial_keys

    def key(self, sort_key: str) -> dict[str, dict[str, str]]:
        """The primary key of one of the application's items."""
        return {"app": {"S": self.app}, "key": {"S": sort_key}}

    def delete(self, sort_key: str) -> tuple[str, dict, int]:
        """A write that deletes one item."""
        return sort_key, {"Delete": {"TableName": self.table, "Key": self.key(sort_key)}}, 0

    def buckets(
        self,
        epoch: int,
        changed: Mapping[ShardId, StoredShard],
        now: str,
        deletes: Sequence[str] = (),
        dropped: Collection[ShardId] = frozenset(),
    ) -> int:
        """Rewrite every bucket holding a shard of ``changed`` or ``dropped`` (without the
        ``dropped`` ones; then delete the ``deletes`` sort keys), in as few fenced transactions
        as DynamoDB's limits allow."""
        merged = {**self.known_shards(), **changed}
        touched = {bucket_key(k) for k in changed} | {bucket_key(k) for k in dropped}
        grouped: dict[str, dict[ShardId, StoredShard]] = {bucket: {} for bucket in touched}
        for sid, shard in merged.items():
            if sid not in dropped and bucket_key(sid) in touched:
                grouped[bucket_key(sid)][sid] = shard
        writes = []
        for bucket in sorted(touched):
            body = json.dumps(
                {str(k): entry_of(s) for k, s in grouped[bucket].items()},
                sort_keys=True, separators=(",", ":"),
            )
            if len(body) > MAX_ITEM_BYTES:
                # Finished shards are dropped once their children are committed, so only a
                # huge number of live shards (or of shards in the stored initial positions) or
                # many streams per application get here.
                raise CheckpointError(
                    f"The positions of the {self._where()} no longer fit DynamoDB items "
                    f"({len(merged)} shards): read fewer streams per application, or drop "
                    "shards no longer needed with `kinesis-ddb checkpoints export`, editing the "
                    "file, and `checkpoints reset --to-file`"
                )
            version = self.versions.get(bucket)
            put: dict[str, Any] = {
                "TableName": self.table,
                "Item": {
                    **self.key(bucket),
                    "positions": {"S": body},
                    "version": {"N": str((version or 0) + 1)},
                    "epoch": {"N": str(epoch)},
                    "committedAt": {"S": now},
                },
            }
            if version is None:
                put["ConditionExpression"] = "attribute_not_exists(#k)"
                put["ExpressionAttributeNames"] = {"#k": "key"}
            else:
                put["ConditionExpression"] = "#v = :v"
                put["ExpressionAttributeNames"] = {"#v": "version"}
                put["ExpressionAttributeValues"] = {":v": {"N": str(version)}}
            writes.append((bucket, {"Put": put}, len(body)))
        for key in deletes:
            writes.append(self.delete(key))

        def written(names: list[str]) -> None:
            assert self.known is not None
            for name in names:
                if name in grouped:
                    self.versions[name] = self.versions.get(name, 0) + 1
                    for sid in dropped:
                        if bucket_key(sid) == name:
                            self.known.pop(sid, None)
                    self.known.update(grouped[name])

        return self.run(epoch, writes, written)

    def initial(
        self, epoch: int, spec: str, resolved: Offset, streams: Mapping[str, str]
    ) -> None:
        """Store the initial position in force, resolved per shard into ``initial#NN`` items,
        with the streams' identities, replacing what was stored before; fenced.

        The meta item names the new items (``initialId``) in the last transaction, so readers
        see the whole new set or what was there before. Up to about 35,000 shards that is a
        single transaction; past it, a failure midway can leave an earlier set partly
        overwritten (the source saves only where none is stored, so it never has one).
        """
        set_id = uuid.uuid4().hex
        grouped: dict[str, dict[str, str]] = {}
        for sid, pos in resolved.shards.items():
            grouped.setdefault(initial_bucket_key(sid), {})[str(sid)] = pos.to_str()
        writes = []
        for bucket in sorted(grouped):
            body = json.dumps(grouped[bucket], sort_keys=True, separators=(",", ":"))
            if len(body) > MAX_ITEM_BYTES:
                raise CheckpointError(
                    f"The initial positions of the {self._where()} do not fit DynamoDB items "
                    f"({len(resolved.shards)} shards in {len(resolved.streams)} stream(s); item "
                    f"{bucket} would hold {len(body)} bytes): read fewer streams per "
                    "application, giving each group of streams its own 'applicationName'"
                )
            item = {
                **self.key(bucket),
                "positions": {"S": body},
                "initialId": {"S": set_id},
                "epoch": {"N": str(epoch)},
            }
            writes.append((bucket, {"Put": {"TableName": self.table, "Item": item}}, len(body)))
        for key in sorted(self._initial_keys_now() - set(grouped)):
            writes.append(self.delete(key))
        update = {
            "Update": {
                "TableName": self.table,
                "Key": self.key(META_KEY),
                "UpdateExpression": (
                    "SET initialSpec = :s, streams = :st, initialId = :i "
                    "REMOVE resolved, initialSpecId"
                    if len(spec) <= MAX_INLINE_SPEC
                    # A long spec stays in its spec#NNNN items (or, given as an option, is not
                    # kept: the positions resolved from it are what a restart reads).
                    else "SET streams = :st, initialId = :i REMOVE resolved"
                ),
                "ConditionExpression": "epoch = :e",
                "ExpressionAttributeValues": {
                    **({":s": {"S": spec}} if len(spec) <= MAX_INLINE_SPEC else {}),
                    ":st": {"S": json.dumps(dict(streams), sort_keys=True)},
                    ":i": {"S": set_id},
                    ":e": {"N": str(epoch)},
                },
            }
        }
        self.initial_keys = None  # unknown until done: a failure midway leaves some written
        self.run(epoch, writes, meta_update=update)
        self.initial_keys = set(grouped)


    def run(
        self,
        epoch: int,
        writes: list[tuple[str, dict, int]],
        written: Callable[[list[str]], None] = lambda names: None,
        meta_update: Mapping[str, Any] | None = None,
    ) -> int:
        """Run ``(name, operation, bytes)`` writes in transactions within DynamoDB's limits,
        each with the epoch check; ``written`` hears the names of each transaction done.

        ``meta_update`` (an ``Update`` of the meta item, conditional on ``epoch``) takes the
        check's place in the last transaction: a transaction may not touch an item twice, and
        so the meta item changes with the last writes or not at all."""
        check = {
            "ConditionCheck": {
                "TableName": self.table,
                "Key": self.key(META_KEY),
                "ConditionExpression": "epoch = :e",
                "ExpressionAttributeValues": {":e": {"N": str(epoch)}},
            }
        }
        chunks = transactions(writes)
        if meta_update is not None and not chunks:
            chunks = [[]]
        calls = 0
        for n, chunk in enumerate(chunks):
            names = [name for name, _, _ in chunk]
            fence = meta_update if meta_update is not None and n == len(chunks) - 1 else check
            try:
                self._client.transact_write_items(
                    TransactItems=[fence, *(op for _, op, _ in chunk)]
                )
            except ClientError as exc:
                if error_code(exc) != "TransactionCanceledException":
                    raise
                self._explain_cancel(exc, epoch, names)
            calls += 1
            written(names)
        return calls


    def _explain_cancel(self, exc: ClientError, epoch: int, names: list[str]) -> None:
        reasons = [r.get("Code") for r in exc.response.get("CancellationReasons", [])]
        if reasons and reasons[0] == "ConditionalCheckFailed":
            raise self._fenced(epoch) from None
        failed = [names[i - 1] for i, code in enumerate(reasons) if i and code == "ConditionalCheckFailed"]
        if failed:
            self.known = None  # re-read before any further write
            raise CheckpointError(
                f"DynamoDB item(s) {', '.join(failed)} of the {self._where()} were written by "
                "someone else after this query read them, under the same epoch (a second "
                "writer not going through a claim?): nothing was written; restart the query"
            ) from None
        raise exc

    def long_spec(self, epoch: int, spec: str, also: str) -> set[str]:
        """Store an initial position spec too long for the meta item (a per-shard file of
        thousands of shards) in spec#NNNN items, then name them in the meta item (with the
        ``also`` clause, e.g. ``REMOVE ...``) in the last transaction; returns their keys."""
        spec_id = uuid.uuid4().hex
        puts = []
        for n, at in enumerate(range(0, len(spec), SPEC_CHUNK)):
            name, text = f"{SPEC_PREFIX}{n:04d}", spec[at : at + SPEC_CHUNK]
            item = {**self.key(name), "text": {"S": text}, "specId": {"S": spec_id}}
            puts.append((name, {"Put": {"TableName": self.table, "Item": item}}, len(text)))
        update = {
            "Update": {
                "TableName": self.table,
                "Key": self.key(META_KEY),
                "UpdateExpression": f"SET initialSpecId = :i {also}, initialSpec",
                "ConditionExpression": "epoch = :e",
                "ExpressionAttributeValues": {":i": {"S": spec_id}, ":e": {"N": str(epoch)}},
            }
        }
        self.run(epoch, puts, meta_update=update)
        return {name for name, _, _ in puts}
