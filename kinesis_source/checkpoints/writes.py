"""One application's writes to the checkpoint table, in ``TransactWriteItems`` calls within
DynamoDB's limits, each fenced by the epoch, and what the table holds as last read or written
here (fencing makes it exact: no one else writes while this epoch holds). Commits and
compactions are ``commit_log.py``'s; the stored initial positions and long specs are here."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from botocore.exceptions import ClientError

from kinesis_source.aws.clients import error_code
from kinesis_source.checkpoints.deltas import Ring
from kinesis_source.checkpoints.format import (
    MAX_INLINE_SPEC,
    MAX_ITEM_BYTES,
    META_KEY,
    SPEC_CHUNK,
    SPEC_PREFIX,
    StoredShard,
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
        self.bucket_bytes: dict[str, int] = {}  # bucket sort key -> the item's size
        self.initial_keys: set[str] | None = None  # sort keys of the initial#NN items
        self.ring = Ring()  # format 4's log, as last read or written
        self.meta_bytes = 0  # the meta item's size (each commit's epoch check costs by it)
        self.last_commit_units = 0  # write units of the last commit, as estimated
        self.last_compaction_units = 0

    def fenced(self, epoch: int) -> CheckpointFencedError:
        """The error for a lost epoch check."""
        return self._fenced(epoch)

    def where(self) -> str:
        """Names application and table, for errors."""
        return self._where()

    @property
    def client(self) -> Any:
        """The DynamoDB client."""
        return self._client

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
            raise self.foreign(failed) from None
        raise exc

    def foreign(self, names: list[str], outcome: str = "nothing was written") -> CheckpointError:
        """The error for items written by someone else under this epoch (what is known here is
        read again before any further write)."""
        self.known = None
        return CheckpointError(
            f"DynamoDB item(s) {', '.join(names)} of the {self._where()} were written by "
            "someone else after this query read them, under the same epoch (a second "
            f"writer not going through a claim?): {outcome}; restart the query"
        )

    def long_spec(
        self, epoch: int, spec: str, also: str, values: Mapping[str, Any] | None = None
    ) -> set[str]:
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
                "ExpressionAttributeValues": {
                    ":i": {"S": spec_id}, ":e": {"N": str(epoch)}, **(values or {}),
                },
            }
        }
        self.run(epoch, puts, meta_update=update)
        return {name for name, _, _ in puts}
