"""The DynamoDB checkpoint store: claim, commit, restore, fencing, reset.

One table, keyed by application: partition key ``app`` (= ``applicationName``), sort key ``key``.

- ``key = "meta"``: ``epoch`` (bumped by every claim and reset), ``owner``/``ownerHost``/
  ``claimedAt`` of the latest claimant, ``formatVersion``, ``streams`` (each stream's creation
  time, to detect a stream re-created under the same name), ``initialSpec`` (the initial position
  in force) and ``initialId`` (which ``initial#NN`` items hold it resolved).
- ``key = "shards#NN"`` (format 2), one of :data:`BUCKETS` buckets a shard falls in by a CRC32 of
  its offset key: ``positions`` (canonical JSON: offset key -> position, epoch, owner and time of
  that shard's last commit), ``version`` (bumped by every write), ``epoch``, ``committedAt``.
- ``key = "initial#NN"`` (format 3), the same buckets for the initial position resolved per shard,
  stored once so a restart before the first commit starts at the same place: ``positions``
  (canonical JSON: offset key -> position), ``initialId``, ``epoch``. Only items whose
  ``initialId`` is the meta item's are read, so a save or a reset cut short between transactions
  never leaves a mix of two sets in force. Format 2 kept this offset inline in the meta item
  (``resolved``), which capped an application at about 4,000 shards (400 KB); it is still read
  when the meta item names no ``initialId``.
- ``key = "shard#<stream>#<shardId>"``: format 1, one item per shard. Still read, and rewritten
  into buckets by :meth:`CheckpointStore.migrate`.

Every commit is one ``TransactWriteItems`` (more only past 99 buckets' worth or 3.5 MB): a
``ConditionCheck`` that the meta item still has the caller's epoch, and one ``Put`` per bucket
holding a shard that advanced, conditional on the bucket's version being the one last read or
written. So 1,000 positions take one call, not eleven, and fencing stays per transaction.

Every format change bumps :data:`FORMAT_VERSION`, which :meth:`CheckpointStore.claim` writes: an
older release refuses the application instead of misreading it (one before format 3 would not
see the ``initial#NN`` items and resolve ``LATEST`` again, skipping records).
"""

from __future__ import annotations

import functools
import json
import logging
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from kinesis_source.aws.clients import error_code
from kinesis_source.checkpoints.format import (
    BUCKET_PREFIX,
    FORMAT_VERSION,
    INITIAL_PREFIX,
    MAX_ITEM_BYTES,
    META_KEY,
    SHARD_PREFIX,
    Meta,
    Snapshot,
    StoredShard,
    advances,
    bucket_key,
    entry_of,
    from_ddb,
    initial_bucket_key,
    now_iso,
    offset_key_of,
    order_key,
    shard_of_entry,
    transactions,
)
from kinesis_source.errors import (
    CheckpointError,
    CheckpointFencedError,
    CheckpointTableError,
)
from kinesis_source.positions import Offset, Position, split_shard_key

log = logging.getLogger(__name__)


_WAIT = {"Delay": 1, "MaxAttempts": 300}  # table creation: poll each second, up to 5 minutes


F = TypeVar("F", bound=Callable[..., Any])


def _names_the_table(method: F) -> F:
    """A DynamoDB error the store does not handle itself (retries exhausted, access denied, the
    endpoint unreachable) reaches the user naming the table and application, not only the API
    operation botocore names."""

    @functools.wraps(method)
    def wrapper(self: CheckpointStore, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except (ClientError, BotoCoreError) as exc:
            raise CheckpointError(
                f"DynamoDB failed for {self._where()}: {exc}. Check option "
                "'dynamodbEndpointUrl'/'dynamodbRegion', the credentials' DynamoDB permissions "
                "and the table; throttling, 5xx and network errors were retried 'maxRetries' "
                "times."
            ) from exc

    return wrapper  # type: ignore[return-value]


class CheckpointStore:
    """One application's rows in the checkpoint table, over a boto3 DynamoDB client.

    Every public method raises :class:`CheckpointError` (naming table and application) for
    DynamoDB errors it does not handle itself.
    """

    def __init__(self, client: Any, table: str, app: str) -> None:
        self._client = client
        self.table = table
        self.app = app
        # What the table holds, as last read (snapshot) or written here: commits rewrite whole
        # buckets from it. Fencing makes it exact: no one else writes while this epoch holds.
        self._known: dict[str, StoredShard] | None = None
        self._versions: dict[str, int] = {}  # bucket sort key -> version
        # Sort keys of the initial#NN items, as last read or written (None: unknown).
        self._initial_keys: set[str] | None = None

    @property
    def client(self) -> Any:
        """The DynamoDB client (the CLI reads other tables with it)."""
        return self._client

    def _where(self) -> str:
        return f"application '{self.app}' in DynamoDB table '{self.table}'"

    # -- the table -----------------------------------------------------------------------

    @_names_the_table
    def ensure_table(self, create: bool) -> None:
        """Check the table's key schema; create it first (on-demand) if missing and allowed."""
        try:
            desc = self._client.describe_table(TableName=self.table)["Table"]
        except ClientError as exc:
            if error_code(exc) != "ResourceNotFoundException":
                raise
            if not create:
                raise CheckpointTableError(
                    f"DynamoDB checkpoint table '{self.table}' does not exist and option "
                    "'createTable' is false: create it (partition key 'app' S, sort key 'key' S) "
                    "or set createTable=true"
                ) from None
            self._create()
            desc = self._client.describe_table(TableName=self.table)["Table"]
        self._check_schema(desc)

    def _create(self) -> None:
        log.info("creating DynamoDB checkpoint table %s (on-demand)", self.table)
        try:
            self._client.create_table(
                TableName=self.table,
                KeySchema=[
                    {"AttributeName": "app", "KeyType": "HASH"},
                    {"AttributeName": "key", "KeyType": "RANGE"},
                ],
                AttributeDefinitions=[
                    {"AttributeName": "app", "AttributeType": "S"},
                    {"AttributeName": "key", "AttributeType": "S"},
                ],
                BillingMode="PAY_PER_REQUEST",
            )
        except ClientError as exc:
            if error_code(exc) != "ResourceInUseException":  # another query created it first
                raise
        self._client.get_waiter("table_exists").wait(TableName=self.table, WaiterConfig=_WAIT)

    def _check_schema(self, desc: Mapping[str, Any]) -> None:
        keys = {k["AttributeName"]: k["KeyType"] for k in desc.get("KeySchema", [])}
        types = {a["AttributeName"]: a["AttributeType"] for a in desc.get("AttributeDefinitions", [])}
        if keys != {"app": "HASH", "key": "RANGE"} or types.get("app") != "S" or types.get("key") != "S":
            shown = ", ".join(f"{k} {t} ({types.get(k, '?')})" for k, t in keys.items())
            raise CheckpointTableError(
                f"DynamoDB table '{self.table}' has key schema [{shown}], but a kinesis-ddb "
                "checkpoint table needs partition key 'app' (S) and sort key 'key' (S): set "
                "option 'checkpointTable' to another table"
            )

    # -- reading -------------------------------------------------------------------------

    @_names_the_table
    def snapshot(self) -> Snapshot:
        """Read the meta item and every position (strongly consistent)."""
        meta = None
        shards: dict[str, StoredShard] = {}
        legacy: dict[str, StoredShard] = {}
        legacy_keys = []
        versions: dict[str, int] = {}
        initial: dict[str, dict[str, str]] = {}  # by initialId: offset key -> position
        initial_keys = set()
        pages = self._client.get_paginator("query").paginate(
            TableName=self.table,
            KeyConditionExpression="app = :a",
            ExpressionAttributeValues={":a": {"S": self.app}},
            ConsistentRead=True,
        )
        for page in pages:
            for raw in page.get("Items", []):
                item = from_ddb(raw)
                key = item["key"]
                if key == META_KEY:
                    meta = Meta.from_item(item)
                elif key.startswith(BUCKET_PREFIX):
                    versions[key] = int(item.get("version", 0))
                    for offset_key, entry in json.loads(item["positions"]).items():
                        shards[offset_key] = shard_of_entry(entry)
                elif key.startswith(INITIAL_PREFIX):
                    initial_keys.add(key)
                    initial.setdefault(item.get("initialId", ""), {}).update(
                        json.loads(item["positions"])
                    )
                elif key.startswith(SHARD_PREFIX):
                    legacy_keys.append(key)
                    legacy[offset_key_of(key)] = StoredShard(
                        position=Position.parse(item["position"]),
                        epoch=int(item.get("epoch", 0)),
                        owner=item.get("owner"),
                        committed_at=item.get("committedAt"),
                    )
        if meta is not None and meta.format_version > FORMAT_VERSION:
            raise self._newer_format(meta.format_version)
        if meta is not None and meta.initial_id is not None:
            # The set the meta item names wins over format 2's inline offset, and items of any
            # other set (a save or a reset cut short) are not read.
            stored = initial.get(meta.initial_id, {})
            meta = replace(
                meta, resolved=Offset({k: Position.parse(p) for k, p in stored.items()})
            )
        for offset_key, old in legacy.items():
            # A migration cut short leaves both: the further one is the commit.
            if offset_key not in shards or advances(old.position, shards[offset_key].position):
                shards[offset_key] = old
        self._known = dict(shards)
        self._versions = versions
        self._initial_keys = initial_keys
        return Snapshot(meta, shards, frozenset(legacy_keys))

    def _newer_format(self, version: int) -> CheckpointError:
        return CheckpointError(
            f"The {self._where()} was written in format {version}, newer than this "
            f"kinesis-ddb understands ({FORMAT_VERSION}): upgrade kinesis-ddb"
        )

    # -- claiming and fencing ------------------------------------------------------------

    @_names_the_table
    def claim(self, owner: str, host: str) -> Meta:
        """Take the application over: bump the epoch, record the owner, and mark the format
        this release writes (refused if a newer release already wrote a newer one)."""
        try:
            resp = self._client.update_item(
                TableName=self.table,
                Key=self._key(META_KEY),
                UpdateExpression=(
                    "SET epoch = if_not_exists(epoch, :zero) + :one, #o = :o, ownerHost = :h, "
                    "claimedAt = :t, formatVersion = :v"
                ),
                ConditionExpression="attribute_not_exists(formatVersion) OR formatVersion <= :v",
                ExpressionAttributeNames={"#o": "owner"},
                ExpressionAttributeValues={
                    ":zero": {"N": "0"},
                    ":one": {"N": "1"},
                    ":o": {"S": owner},
                    ":h": {"S": host},
                    ":t": {"S": now_iso()},
                    ":v": {"N": str(FORMAT_VERSION)},
                },
                ReturnValues="ALL_NEW",
            )
        except ClientError as exc:
            if error_code(exc) != "ConditionalCheckFailedException":
                raise
            meta = self.snapshot_meta()
            raise self._newer_format(meta.format_version if meta else FORMAT_VERSION + 1) from None
        meta = Meta.from_item(from_ddb(resp["Attributes"]))
        log.info("claimed %s as epoch %d (owner %s)", self._where(), meta.epoch, owner)
        return meta

    @_names_the_table
    def snapshot_meta(self) -> Meta | None:
        """The meta item alone (consistent read), or None."""
        resp = self._client.get_item(
            TableName=self.table, Key=self._key(META_KEY), ConsistentRead=True
        )
        return Meta.from_item(from_ddb(resp["Item"])) if "Item" in resp else None

    @_names_the_table
    def check_epoch(self, epoch: int) -> None:
        """Raise :class:`CheckpointFencedError` if another query claimed after ``epoch``."""
        meta = self.snapshot_meta() or Meta()
        if meta.epoch != epoch:
            raise self._fenced(epoch, meta)

    def _fenced(self, epoch: int, meta: Meta | None = None) -> CheckpointFencedError:
        meta = meta or self.snapshot_meta() or Meta()
        return CheckpointFencedError(
            f"The {self._where()} was claimed by another query (owner {meta.owner} on "
            f"{meta.owner_host}, epoch {meta.epoch}, at {meta.claimed_at}) after this one "
            f"(epoch {epoch}). This query stops so that the two cannot overwrite each other's "
            "positions: stop the other query, or give this one another 'applicationName'."
        )

    @_names_the_table
    def save_initial(
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
        stream_names = {split_shard_key(k)[0] for k in resolved.shards}
        grouped: dict[str, dict[str, str]] = {}
        for key, pos in resolved.shards.items():
            grouped.setdefault(initial_bucket_key(key), {})[key] = pos.to_str()
        writes = []
        for bucket in sorted(grouped):
            body = json.dumps(grouped[bucket], sort_keys=True, separators=(",", ":"))
            if len(body) > MAX_ITEM_BYTES:
                raise CheckpointError(
                    f"The initial positions of the {self._where()} do not fit DynamoDB items "
                    f"({len(resolved.shards)} shards in {len(stream_names)} stream(s); item "
                    f"{bucket} would hold {len(body)} bytes): read fewer streams per "
                    "application, giving each group of streams its own 'applicationName'"
                )
            item = {
                **self._key(bucket),
                "positions": {"S": body},
                "initialId": {"S": set_id},
                "epoch": {"N": str(epoch)},
            }
            writes.append((bucket, {"Put": {"TableName": self.table, "Item": item}}, len(body)))
        for key in sorted(self._initial_keys_now() - set(grouped)):
            writes.append((key, {"Delete": {"TableName": self.table, "Key": self._key(key)}}, 0))
        update = {
            "Update": {
                "TableName": self.table,
                "Key": self._key(META_KEY),
                "UpdateExpression": (
                    "SET initialSpec = :s, streams = :st, initialId = :i REMOVE resolved"
                ),
                "ConditionExpression": "epoch = :e",
                "ExpressionAttributeValues": {
                    ":s": {"S": spec},
                    ":st": {"S": json.dumps(dict(streams), sort_keys=True)},
                    ":i": {"S": set_id},
                    ":e": {"N": str(epoch)},
                },
            }
        }
        self._initial_keys = None  # unknown until done: a failure midway leaves some written
        self._fenced_writes(epoch, writes, meta_update=update)
        self._initial_keys = set(grouped)

    @_names_the_table
    def save_streams(self, epoch: int, streams: Mapping[str, str]) -> None:
        """Record the streams' identities (creation times) in the meta item."""
        self._update_meta(
            epoch, "SET streams = :st", {":st": {"S": json.dumps(dict(streams), sort_keys=True)}}
        )

    def _update_meta(self, epoch: int, expression: str, values: dict[str, Any]) -> None:
        try:
            self._client.update_item(
                TableName=self.table,
                Key=self._key(META_KEY),
                UpdateExpression=expression,
                ConditionExpression="epoch = :e",
                ExpressionAttributeValues={**values, ":e": {"N": str(epoch)}},
            )
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                raise self._fenced(epoch) from None
            raise

    # -- committing ----------------------------------------------------------------------

    @_names_the_table
    def commit(
        self,
        epoch: int,
        owner: str,
        positions: Mapping[str, Position],
        forget: Iterable[str] = (),
    ) -> int:
        """Write positions in fenced transactions; returns the number of calls made.

        A position behind the stored one is refused (nothing is written); one equal to it is
        left alone. Each transaction is conditional on the meta item still holding ``epoch``
        and on every bucket it rewrites still being at the version last seen here.

        ``forget`` names shards to drop from the table, in the same transactions: only shards
        stored at ``SHARD_END`` are dropped (the caller knows a resume finds them finished
        without them), so resharding does not grow the table without bound.
        """
        known = self._known_now()
        for key, pos in positions.items():
            if order_key(pos) is None:
                raise ValueError(f"position {pos} of {key} is not a commit position")
        behind = sorted(
            k for k, p in positions.items()
            if k in known and advances(known[k].position, p)
        )
        if behind:
            raise CheckpointError(
                f"Refused to move shard(s) {', '.join(behind)} of the {self._where()} "
                "backwards: their stored positions are ahead of this commit (was the "
                "application reset while this query ran?)"
            )
        now = now_iso()
        changed = {
            k: StoredShard(p, epoch, owner, now)
            for k, p in positions.items()
            if k not in known or known[k].position != p
        }
        dropped = {
            k for k in forget
            if k not in positions and k in known and known[k].position.is_shard_end
        }
        if not changed and not dropped:
            return 0
        return self._write_buckets(epoch, changed, now, dropped=dropped)

    @_names_the_table
    def migrate(self, epoch: int) -> int:
        """Rewrite format-1 items (one per shard) into buckets and delete them, fenced;
        returns the number of calls made (0 when there were none)."""
        snap = self.snapshot()
        if not snap.legacy:
            return 0
        calls = self._write_buckets(epoch, dict(snap.shards), now_iso(), sorted(snap.legacy))
        log.info(
            "moved %d shard position(s) of the %s to format %d in %d call(s)",
            len(snap.legacy), self._where(), FORMAT_VERSION, calls,
        )
        return calls

    def _known_now(self) -> dict[str, StoredShard]:
        if self._known is None:
            self.snapshot()
        assert self._known is not None
        return self._known

    def _initial_keys_now(self) -> set[str]:
        if self._initial_keys is None:
            self.snapshot()
        assert self._initial_keys is not None
        return self._initial_keys

    def _write_buckets(
        self,
        epoch: int,
        changed: Mapping[str, StoredShard],
        now: str,
        deletes: Sequence[str] = (),
        dropped: Collection[str] = frozenset(),
    ) -> int:
        """Rewrite every bucket holding a shard of ``changed`` or ``dropped`` (without the
        ``dropped`` ones; then delete the ``deletes`` sort keys), in as few fenced transactions
        as DynamoDB's limits allow."""
        merged = {**self._known_now(), **changed}
        touched = {bucket_key(k) for k in changed} | {bucket_key(k) for k in dropped}
        grouped: dict[str, dict[str, StoredShard]] = {bucket: {} for bucket in touched}
        for key, shard in merged.items():
            if key not in dropped and bucket_key(key) in touched:
                grouped[bucket_key(key)][key] = shard
        writes = []
        for bucket in sorted(touched):
            body = json.dumps(
                {k: entry_of(s) for k, s in grouped[bucket].items()},
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
            version = self._versions.get(bucket)
            put: dict[str, Any] = {
                "TableName": self.table,
                "Item": {
                    **self._key(bucket),
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
            writes.append((key, {"Delete": {"TableName": self.table, "Key": self._key(key)}}, 0))

        def written(names: list[str]) -> None:
            assert self._known is not None
            for name in names:
                if name in grouped:
                    self._versions[name] = self._versions.get(name, 0) + 1
                    for key in dropped:
                        if bucket_key(key) == name:
                            self._known.pop(key, None)
                    self._known.update(grouped[name])

        return self._fenced_writes(epoch, writes, written)

    def _fenced_writes(
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
                "Key": self._key(META_KEY),
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
            self._known = None  # re-read before any further write
            raise CheckpointError(
                f"DynamoDB item(s) {', '.join(failed)} of the {self._where()} were written by "
                "someone else after this query read them, under the same epoch (a second "
                "writer not going through a claim?): nothing was written; restart the query"
            ) from None
        raise exc

    # -- reset ---------------------------------------------------------------------------

    @_names_the_table
    def reset(self, spec: str, by: str) -> Meta:
        """Move the application to a new initial position: fence running queries (epoch + 1),
        forget committed positions, and store ``spec`` for the next query to resolve."""
        meta = self.claim(owner=f"reset by {by}", host=by)
        # The streams' identities go too: a reset is how a re-created stream is accepted.
        # Removing initialId retires the initial#NN items at once; deleting them below only
        # tidies, so a reset cut short never leaves the old initial positions in force.
        self._update_meta(
            meta.epoch,
            "SET initialSpec = :s REMOVE resolved, streams, initialId",
            {":s": {"S": spec}},
        )
        snap = self.snapshot()
        keys = sorted(self._versions) + sorted(self._initial_keys_now()) + sorted(snap.legacy)
        deletes = [(k, {"Delete": {"TableName": self.table, "Key": self._key(k)}}, 0) for k in keys]
        self._fenced_writes(meta.epoch, deletes)
        self._known, self._versions, self._initial_keys = {}, {}, set()
        return meta

    def _key(self, sort_key: str) -> dict[str, dict[str, str]]:
        return {"app": {"S": self.app}, "key": {"S": sort_key}}
