"""The application as one query run holds it in DynamoDB: claimed once (a new epoch fences
older runs), what the table held then, the positions committed since, the stored initial
positions, and the streams' identities.

Claimed on the first driver call, never in ``__init__`` (which also runs in the user's process
and on executors). The start resolution (``start.py``) and the commits (``commits.py``) share
it; both reach the shards only through the narrow :class:`ShardCatalogue`.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Protocol

from kinesis_source.aws.clients import AwsSettings
from kinesis_source.aws.kinesis import ShardInfo
from kinesis_source.checkpoints.format import Meta, Snapshot
from kinesis_source.checkpoints.store import CheckpointStore
from kinesis_source.errors import CheckpointError
from kinesis_source.option_values import InitialPosition
from kinesis_source.options import SourceOptions
from kinesis_source.positions import Offset, Position, ShardId

log = logging.getLogger(__name__)


class ShardCatalogue(Protocol):
    """What the driver's start and commit code asks of the shards (the planner answers)."""

    def listed(self) -> Mapping[str, list[ShardInfo]]:
        """The shard listing as last fetched (no call)."""

    def shard_ids(self) -> set[ShardId]:
        """Every listed shard (listing first if none was made)."""

    def stream_identities(self) -> dict[str, str]:
        """Each stream's creation time."""

    def streams_entering(self, start: Offset) -> list[str]:
        """Streams with shards but none in ``start``."""

    def resolve_initial(self, spec: InitialPosition, streams: Any = None) -> Offset:
        """An initial position resolved per listed shard (of ``streams`` only, if given)."""


class Application:
    """One application's rows as this run claimed them; the source of truth for what DynamoDB
    holds (fencing makes it exact: nobody else writes while this epoch holds)."""

    def __init__(
        self,
        opts: SourceOptions,
        store: CheckpointStore,
        catalogue: ShardCatalogue,
        owner: str | None = None,
    ) -> None:
        self.opts = opts
        self.store = store
        self.catalogue = catalogue
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.epoch: int | None = None
        self.claimed: Snapshot | None = None  # what the table held at the claim
        self.stored: dict[ShardId, Position] = {}  # committed positions, kept current by commits
        self.resolved: Offset | None = None  # the stored initial positions, once known

    @staticmethod
    def for_options(opts: SourceOptions, catalogue: ShardCatalogue) -> Application:
        """The application named by the options, on the checkpoint table they name."""
        store = CheckpointStore(
            AwsSettings.for_dynamodb(opts).failing_fast().boto3_client("dynamodb"),
            opts.checkpoint_table,
            opts.application_name,
        )
        return Application(opts, store, catalogue)

    @property
    def meta(self) -> Meta | None:
        """The meta item as claimed (with the identities recorded since)."""
        return self.claimed.meta if self.claimed else None

    def claim(self) -> int:
        """The run's epoch, claiming the application first if this run has not yet: the
        table is made ready, format-1 rows migrated, a re-created stream refused and every
        stream's identity recorded. The streams are looked up first, so a wrong stream name or
        Kinesis endpoint fails before the application is claimed (and fences anybody)."""
        if self.epoch is None:
            self.catalogue.stream_identities()
            self.store.ensure_table(self.opts.create_table)
            meta = self.store.claim(self.owner, socket.gethostname())
            snapshot = self.store.snapshot()
            if snapshot.legacy:  # written by a release before checkpoint format 2
                self.store.migrate(meta.epoch)
            self._check_same_streams(snapshot)
            self.claimed = snapshot
            self.stored = snapshot.positions()
            self.resolved = snapshot.meta.resolved if snapshot.meta else None
            self.epoch = meta.epoch
            self._record_streams()
        return self.epoch

    def _check_same_streams(self, snapshot: Snapshot) -> None:
        current = self.catalogue.stream_identities()
        known = dict(snapshot.meta.streams) if snapshot.meta else {}
        app, table = self.opts.application_name, self.opts.checkpoint_table
        for stream, created in current.items():
            before = known.get(stream)
            if before is not None and before != created:
                raise CheckpointError(
                    f"Kinesis stream '{stream}' was deleted and re-created (created {created}; "
                    f"the checkpoints of application '{app}' in table '{table}' are for the "
                    f"stream created {before}). Its old sequence numbers mean nothing in the new "
                    "stream: run `kinesis-ddb checkpoints reset` for this application, or use "
                    "another 'applicationName'."
                )
        committed_streams = {k.stream for k in snapshot.shards}
        if committed_streams & set(current):
            listed = self.catalogue.shard_ids()
            for stream in committed_streams & set(current):
                mine = {k for k in snapshot.shards if k.stream == stream}
                if not mine & listed:
                    raise CheckpointError(
                        f"None of the shards committed for Kinesis stream '{stream}' "
                        f"(application '{app}', table '{table}') exist in the stream now: it was "
                        "re-created or its shards expired. Run `kinesis-ddb checkpoints reset`."
                    )

    def _record_streams(self) -> None:
        """Record the identity of every stream the query reads that the meta item does not
        name yet (a stream added later included), so a re-created stream is detected."""
        meta = self.meta
        known = dict(meta.streams) if meta else {}
        current = self.catalogue.stream_identities()
        if any(stream not in known for stream in current):
            assert self.epoch is not None
            self.store.save_streams(self.epoch, {**known, **current})
            self.remember_streams({**known, **current})

    def remember_streams(self, identities: Mapping[str, str]) -> None:
        """The meta item now records ``identities``."""
        meta = self.meta
        if self.claimed is not None and meta is not None:
            self.claimed = replace(self.claimed, meta=replace(meta, streams=dict(identities)))

    def streams_known(self) -> set[str]:
        """Streams the application has initial or committed positions for."""
        shards = self.resolved.shards if self.resolved is not None else {}
        return {k.stream for k in (*shards, *self.stored)}
