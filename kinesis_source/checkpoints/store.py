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
- ``key = "spec#NNNN"`` (format 3): an initial position spec too long for the meta item (a
  per-shard file of thousands of shards), in pieces of ``SPEC_CHUNK`` characters: ``text``,
  ``specId`` (named by the meta item's ``initialSpecId``).
- ``key = "shard#<stream>#<shardId>"``: format 1, one item per shard. Still read, and rewritten
  into buckets by :meth:`CheckpointStore.migrate`.

Every commit is one ``TransactWriteItems`` (format 4): a ``ConditionCheck`` that the meta item
still has the caller's epoch, and a ``Put`` of one ``log#NN`` slot holding only the positions
that moved, conditional on the slot holding what was last seen here (several slots, and
transactions, only past 380,000 bytes of them). A compaction now and then folds the log into the
``shards#NN`` buckets (``commit_log.py``; why every state between reads right: ``deltas.py``).

Every format change bumps :data:`FORMAT_VERSION`, which :meth:`CheckpointStore.claim` writes: an
older release refuses the application instead of misreading it (one before format 3 would not
see the ``initial#NN`` items and resolve ``LATEST`` again, skipping records).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from kinesis_source.aws.clients import error_code
from kinesis_source.aws.retries import is_connect_error
from kinesis_source.checkpoints import commit_log
from kinesis_source.checkpoints.deltas import Ring
from kinesis_source.checkpoints.format import (
    FORMAT_VERSION,
    MAX_INLINE_SPEC,
    META_KEY,
    Meta,
    Snapshot,
    bucket_key,
    from_ddb,
    now_iso,
)
from kinesis_source.checkpoints.reading import read_items
from kinesis_source.checkpoints.sizing import item_bytes
from kinesis_source.checkpoints.table import ensure_table
from kinesis_source.checkpoints.writes import FencedWriter
from kinesis_source.errors import (
    NO_CREDENTIALS,
    CheckpointError,
    CheckpointFencedError,
)
from kinesis_source.positions import Offset, Position, ShardId

log = logging.getLogger(__name__)

# The owner a reset claims the application as (the fencing message of a running query tells a
# reset from another query by it).
RESET_OWNER = "reset by "




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
            if is_connect_error(exc):
                # The whole story is in the message: no second, chained traceback.
                raise CheckpointError(
                    f"Could not connect to DynamoDB for {self._where()}: check option "
                    "'dynamodbEndpointUrl' (or 'dynamodbRegion'/'region' when no endpoint is "
                    f"set). {exc}"
                ) from None
            if isinstance(exc, NoCredentialsError):
                raise CheckpointError(
                    f"No AWS credentials for DynamoDB ({self._where()}): {NO_CREDENTIALS}"
                ) from None
            raise CheckpointError(
                f"DynamoDB failed for {self._where()}: {exc}. Check option "
                "'dynamodbEndpointUrl'/'dynamodbRegion', the credentials' DynamoDB permissions "
                "and the table; throttling, 5xx and network errors were retried 'maxRetries' "
                "times."
            ) from exc

    return wrapper  # type: ignore[return-value]


def fenced_error(where: str, epoch: int, meta: Meta) -> CheckpointFencedError:
    """What a query of ``epoch`` is told once ``meta`` shows it was fenced."""
    if (meta.owner or "").startswith(RESET_OWNER):
        return CheckpointFencedError(
            f"The {where} was reset ({meta.owner} on {meta.claimed_at}, epoch "
            f"{meta.epoch}) while this query ran (epoch {epoch}). This query stops so that "
            "it does not write positions over the reset: start it again with a new Spark "
            "checkpoint location to read from the new start position (with its old one, "
            "Spark's offset log resumes where the query stopped)."
        )
    return CheckpointFencedError(
        f"The {where} was claimed by another query (owner {meta.owner} on "
        f"{meta.owner_host}, epoch {meta.epoch}, at {meta.claimed_at}) after this one "
        f"(epoch {epoch}). This query stops so that the two cannot overwrite each other's "
        "positions: stop the other query, or give this one another 'applicationName'."
    )


class CheckpointStore:
    """One application's rows in the checkpoint table, over a boto3 DynamoDB client.

    Every public method raises :class:`CheckpointError` (naming table and application) for
    DynamoDB errors it does not handle itself.
    """

    def __init__(self, client: Any, table: str, app: str) -> None:
        self._client = client
        self.table = table
        self.app = app
        self._writes = FencedWriter(client, table, app, self._where, self._fenced, self.snapshot)
        self._spec_keys: set[str] | None = None  # spec#NNNN items, as last read

    @property
    def writer(self) -> FencedWriter:
        """The store's writer, with what the table holds as last read or written."""
        return self._writes

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
        ensure_table(self._client, self.table, create)

    # -- reading -------------------------------------------------------------------------

    @_names_the_table
    def snapshot(self) -> Snapshot:
        """Read the meta item and every position (strongly consistent)."""
        pages = self._client.get_paginator("query").paginate(
            TableName=self.table,
            KeyConditionExpression="app = :a",
            ExpressionAttributeValues={":a": {"S": self.app}},
            ConsistentRead=True,
        )
        read = read_items(raw for page in pages for raw in page.get("Items", []))
        meta, shards = read.meta, read.shards
        if meta is not None and meta.format_version > FORMAT_VERSION:
            raise self._newer_format(meta.format_version)
        writes = self._writes
        writes.known = dict(shards)
        writes.bucket_bytes = read.bucket_bytes
        writes.initial_keys = read.initial_keys
        writes.ring = read.ring
        writes.meta_bytes = read.meta_bytes
        self._spec_keys = read.spec_keys
        return Snapshot(meta, shards, frozenset(read.legacy_keys), tuple(read.log))

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
        self._writes.meta_bytes = item_bytes(resp["Attributes"])
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
        return fenced_error(self._where(), epoch, meta or self.snapshot_meta() or Meta())

    @_names_the_table
    def save_initial(
        self, epoch: int, spec: str, resolved: Offset, streams: Mapping[str, str]
    ) -> None:
        """Store the initial position in force, resolved per shard into ``initial#NN`` items,
        with the streams' identities, replacing what was stored before; fenced (see
        :meth:`FencedWriter.initial`)."""
        self._writes.initial(epoch, spec, resolved, streams)

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
        positions: Mapping[ShardId, Position],
        forget: Iterable[ShardId] = (),
    ) -> int:
        """Write positions in fenced transactions; returns the number of calls made.

        A position behind the stored one is refused (nothing is written); one equal to it is
        left alone. The positions that moved go into one log item (format 4, ``deltas.py``),
        written in a transaction conditional on the meta item still holding ``epoch`` and on
        the log slot still holding what was last seen here; a compaction goes first when the
        log's ring has no free slot.

        ``forget`` names shards to drop from the table, in the same transactions: only shards
        stored at ``SHARD_END`` are dropped (the caller knows a resume finds them finished
        without them), so resharding does not grow the table without bound.
        """
        changed, dropped = commit_log.changes(self._writes, epoch, owner, positions, forget)
        if not changed and not dropped:
            return 0
        return commit_log.commit(self._writes, epoch, owner, changed, dropped).calls

    @_names_the_table
    def compact(self, epoch: int) -> int:
        """Fold the commit log into the buckets now (commits do it when the log's ring is
        full); returns the number of calls made."""
        self._writes.known_shards()
        return commit_log.compact(self._writes, epoch, now_iso()).calls

    @_names_the_table
    def migrate(self, epoch: int) -> int:
        """Rewrite format-1 items (one per shard) into buckets and delete them, fenced;
        returns the number of calls made (0 when there were none)."""
        snap = self.snapshot()
        if not snap.legacy:
            return 0
        writes = self._writes
        writes.ring.dirty |= {bucket_key(k) for k in snap.shards}
        calls = commit_log.compact(writes, epoch, now_iso()).calls
        calls += writes.run(epoch, [writes.delete(k) for k in sorted(snap.legacy)])
        log.info(
            "moved %d shard position(s) of the %s to format %d in %d call(s)",
            len(snap.legacy), self._where(), FORMAT_VERSION, calls,
        )
        return calls

    # -- reset ---------------------------------------------------------------------------

    @_names_the_table
    def reset(self, spec: str, by: str) -> Meta:
        """Move the application to a new initial position: fence running queries (epoch + 1),
        forget committed positions, and store ``spec`` for the next query to resolve."""
        meta = self.claim(owner=f"{RESET_OWNER}{by}", host=by)
        # The streams' identities go too: a reset is how a re-created stream is accepted.
        # Removing initialId retires the initial#NN items at once; deleting them below only
        # tidies, so a reset cut short never leaves the old initial positions in force.
        # baseEpoch retires every position written before it at once (format 4): deleting the
        # items below only tidies, so a reset cut short never leaves old positions in force.
        forget = "REMOVE resolved, streams, initialId, compactedThrough, compactedAt, compactedWru"
        base = {":b": {"N": str(meta.epoch)}}
        writes = self._writes
        if len(spec) <= MAX_INLINE_SPEC:
            self._update_meta(
                meta.epoch, f"SET initialSpec = :s, baseEpoch = :b {forget}, initialSpecId",
                {":s": {"S": spec}, **base},
            )
            new_specs: set[str] = set()
        else:
            new_specs = writes.long_spec(meta.epoch, spec, f", baseEpoch = :b {forget}", base)
        snap = self.snapshot()
        assert writes.initial_keys is not None
        keys = sorted(writes.bucket_bytes) + sorted(writes.ring.slots)
        keys += sorted(writes.initial_keys) + sorted(snap.legacy)
        assert self._spec_keys is not None
        keys += sorted(self._spec_keys - new_specs)  # of earlier resets
        writes.run(meta.epoch, [writes.delete(k) for k in keys])
        writes.known, writes.bucket_bytes, writes.initial_keys = {}, {}, set()
        writes.ring = Ring(base_epoch=meta.epoch, last_n=writes.ring.last_n)
        return meta

    def _key(self, sort_key: str) -> dict[str, dict[str, str]]:
        return self._writes.key(sort_key)
