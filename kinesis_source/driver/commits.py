"""When positions reach DynamoDB, where a query resumes, and the commit callbacks.

Lives in Spark's driver-side Python helper next to the planner. The application is claimed on
the first driver call (never in ``__init__``, which also runs in the user's process and on
executors). Positions are written

- in ``commit(end)``: Spark finished every batch up to ``end``;
- eagerly in ``latestOffset(start)``: Spark asks for a new end only once every earlier batch is
  committed to the sink, while ``commit`` lags one batch and never comes for a run's last batch.

Only positions that move a shard forward are written; each write is fenced by the epoch. A
shard at ``SHARD_END`` that the offset has retired is dropped from the table in the same write
once a child of it is committed, unless the stored initial positions would bring it back on a
resume: the table holds the live shards, not every shard the stream ever had.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Any, TypeVar

from kinesis_source.aws.clients import AwsSettings
from kinesis_source.checkpoints.callbacks import CommitInfo, load_callback
from kinesis_source.checkpoints.format import Snapshot, advances
from kinesis_source.checkpoints.store import CheckpointStore
from kinesis_source.driver.planner import Planner
from kinesis_source.errors import CheckpointError, CommitCallbackError
from kinesis_source.lineage import droppable, superseded
from kinesis_source.options import SourceOptions, parse_initial_position
from kinesis_source.positions import AFTER, Offset, Position, shard_key, split_shard_key

log = logging.getLogger(__name__)


T = TypeVar("T")


class Checkpointer:
    """Claims the application, restores the start position, writes positions, runs callbacks."""

    def __init__(
        self,
        opts: SourceOptions,
        planner: Planner,
        callback: Callable[[CommitInfo], Any] | None = None,
    ) -> None:
        self._opts = opts
        self._planner = planner
        self._callbacks = [callback] if callback else []
        if opts.on_commit:
            self._callbacks.append(load_callback(opts.on_commit))
        self._store = CheckpointStore(
            AwsSettings.for_dynamodb(opts).boto3_client("dynamodb"),
            opts.checkpoint_table,
            opts.application_name,
        )
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._epoch: int | None = None
        self._claimed: Snapshot | None = None
        self._stored: dict[str, Position] = {}
        self._resolved: Offset | None = None  # the stored initial positions, once known
        self._initial: Offset | None = None
        self._first_start_seen = False
        self._fence_checked = False
        self._writer: ThreadPoolExecutor | None = None
        self.commit_calls = 0

    def _ensure_claimed(self) -> int:
        if self._epoch is None:
            self._store.ensure_table(self._opts.create_table)
            meta = self._store.claim(self.owner, socket.gethostname())
            snapshot = self._store.snapshot()
            if snapshot.legacy:  # written by a release before checkpoint format 2
                self._store.migrate(meta.epoch)
            self._check_same_streams(snapshot)
            self._claimed = snapshot
            self._stored = snapshot.positions()
            self._resolved = snapshot.meta.resolved if snapshot.meta else None
            self._epoch = meta.epoch
            self._ensure_streams_recorded()
        return self._epoch

    def _check_same_streams(self, snapshot: Snapshot) -> None:
        current = self._planner.stream_identities()
        known = dict(snapshot.meta.streams) if snapshot.meta else {}
        for stream, created in current.items():
            before = known.get(stream)
            if before is not None and before != created:
                raise CheckpointError(
                    f"Kinesis stream '{stream}' was deleted and re-created (created {created}; "
                    f"the checkpoints of application '{self._opts.application_name}' in table "
                    f"'{self._opts.checkpoint_table}' are for the stream created {before}). "
                    "Its old sequence numbers mean nothing in the new stream: run `kinesis-ddb "
                    "checkpoints reset` for this application, or use another 'applicationName'."
                )
        committed_streams = {split_shard_key(k)[0] for k in snapshot.shards}
        if committed_streams & set(current):
            listed = self._planner.shard_keys()
            for stream in committed_streams & set(current):
                mine = {k for k in snapshot.shards if split_shard_key(k)[0] == stream}
                if not mine & listed:
                    raise CheckpointError(
                        f"None of the shards committed for Kinesis stream '{stream}' "
                        f"(application '{self._opts.application_name}', table "
                        f"'{self._opts.checkpoint_table}') exist in the stream now: it was "
                        "re-created or its shards expired. Run `kinesis-ddb checkpoints reset`."
                    )

    # -- resume --------------------------------------------------------------------------

    def initial_offset(self) -> Offset:
        """Where a query without a Spark checkpoint starts (the resume matrix)."""
        if self._initial is None:
            self._initial = self._resolve_start()
        return self._initial

    def _resolve_start(self) -> Offset:
        epoch = self._ensure_claimed()
        snapshot = self._claimed
        assert snapshot is not None
        meta = snapshot.meta
        app, table = self._opts.application_name, self._opts.checkpoint_table
        if meta is not None and meta.resolved is not None:
            base = dict(meta.resolved.shards)
            if snapshot.shards:
                log.info(
                    "application %s resumes from %d committed positions in table %s",
                    app, len(snapshot.shards), table,
                )
            else:
                log.info("application %s restarts at its stored initial positions", app)
            base.update(snapshot.positions())
            added = self._planner.streams_entering(Offset(base))
            if added:
                base.update(self._add_streams(added))
            return Offset(base)
        if meta is not None and meta.initial_spec is not None:
            spec_text = meta.initial_spec  # set by `checkpoints reset`
            spec = parse_initial_position(spec_text)
        else:
            spec = self._opts.initial_position
            spec_text = str(spec)
        resolved = self._planner.resolve_initial(spec)
        if snapshot.shards:  # committed rows but no stored initial (e.g. imported): rows win
            resolved = Offset({**resolved.shards, **snapshot.positions()})
        self._store.save_initial(epoch, spec_text, resolved, self._planner.stream_identities())
        self._resolved = resolved
        log.info("application %s starts at %s (stored in table %s)", app, spec_text, table)
        return resolved

    def _add_streams(self, streams: list[str]) -> dict[str, Position]:
        """Start positions for streams added to an application that already has stored
        initial positions: option 'initialPosition' resolved for them alone, stored with the
        others (and the streams' identities), so every later start finds them."""
        assert self._epoch is not None and self._resolved is not None
        spec = self._opts.initial_position
        added = self._planner.resolve_initial(spec, streams)
        merged = Offset({**self._resolved.shards, **added.shards})
        meta = self._claimed.meta if self._claimed else None
        spec_text = meta.initial_spec if meta and meta.initial_spec else str(spec)
        identities = {**(meta.streams if meta else {}), **self._planner.stream_identities()}
        self._store.save_initial(self._epoch, spec_text, merged, identities)
        self._resolved = merged
        self._remember_streams(identities)
        log.info(
            "application %s: stream(s) %s added; they start at %s (stored in table %s)",
            self._opts.application_name, ", ".join(streams), spec, self._opts.checkpoint_table,
        )
        return dict(added.shards)

    def entering(self, start: Offset) -> dict[str, Position] | None:
        """Start positions of streams that have shards but none in ``start`` (Spark's
        checkpoint predates them), or None: they enter the offset in a batch of their own
        (``plan_ranges`` reads nothing of them there). A stream new to the application starts
        at option 'initialPosition' (resolved once and stored); one it knew (re-created while a
        query ran) starts at TRIM_HORIZON, as a new shard does."""
        streams = self._planner.streams_entering(start)
        if not streams:
            return None
        self._ensure_claimed()
        known = set(self._resolved_streams())
        new = [s for s in streams if s not in known]
        positions = self._add_streams(new) if new and self._resolved is not None else {}
        listing = self._planner.listed()
        for stream in streams:
            if stream not in new or self._resolved is None:
                for shard in listing.get(stream, []):
                    positions.setdefault(shard_key(stream, shard.shard_id), Position.trim_horizon())
        return positions

    def _resolved_streams(self) -> set[str]:
        shards = self._resolved.shards if self._resolved is not None else {}
        return {split_shard_key(k)[0] for k in shards} | {
            split_shard_key(k)[0] for k in self._stored
        }

    # -- commits -------------------------------------------------------------------------

    def before_planning(self, start: Offset, probe: Callable[[], T]) -> T:
        """``latestOffset(start)``: every batch up to ``start`` is in the sink, so commit it,
        while ``probe()`` finds the next end; returns what ``probe`` returned.

        The write and the probe are independent (one goes to DynamoDB, the other to Kinesis),
        so the write runs in a worker thread: a batch pays the longer of the two, not both. A
        failed write fails the call even if the probe succeeded.
        """
        epoch = self._ensure_claimed()
        if not self._first_start_seen:
            self._first_start_seen = True
            ahead = [
                k for k, stored in self._stored.items()
                if k in start.shards and advances(stored, start.shards[k])
            ]
            if ahead:
                log.warning(
                    "DynamoDB (application %s, table %s) is ahead of Spark's checkpoint for %d "
                    "shard(s), e.g. %s: Spark's offsets win; those records are read again",
                    self._opts.application_name, self._opts.checkpoint_table, len(ahead), ahead[0],
                )
        moved = self._moved(start)
        retired = self._retired(start, moved)
        self._fence_checked = False
        if not moved and not retired:
            return probe()
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="kinesis-ddb-commit")
        write = self._writer.submit(self._store.commit, epoch, self.owner, moved, retired)
        try:
            result = probe()
        finally:
            # Even when the probe failed: the write must not outlive this call, and its own
            # failure (e.g. fenced) is the one to report.
            self._committed(epoch, moved, retired, write.result())
        self._fence_checked = True  # the write's transaction checked the epoch just now
        return result

    def before_batch(self) -> None:
        """A new batch is about to be planned: make sure no newer query owns the application,
        so a fenced query stops before reading more. The commit in ``before_planning`` already
        checked it when it wrote; else one consistent read."""
        if self._fence_checked:
            self._fence_checked = False
            return
        self._store.check_epoch(self._ensure_claimed())

    def _ensure_streams_recorded(self) -> None:
        """Record the identity of every stream the query reads that the meta item does not
        name yet (a stream added later included), so a re-created stream is detected."""
        meta = self._claimed.meta if self._claimed else None
        known = dict(meta.streams) if meta else {}
        current = self._planner.stream_identities()
        if any(stream not in known for stream in current):
            assert self._epoch is not None
            self._store.save_streams(self._epoch, {**known, **current})
            self._remember_streams({**known, **current})

    def _remember_streams(self, identities: Mapping[str, str]) -> None:
        meta = self._claimed.meta if self._claimed else None
        if self._claimed is not None and meta is not None:
            self._claimed = replace(self._claimed, meta=replace(meta, streams=dict(identities)))

    def commit(self, end: Offset) -> None:
        """Write the shards of ``end`` that moved forward, then call the callbacks."""
        epoch = self._ensure_claimed()
        moved = self._moved(end)
        retired = self._retired(end, moved)
        if moved or retired:
            calls = self._store.commit(epoch, self.owner, moved, retired)
            self._committed(epoch, moved, retired, calls)

    def close(self) -> None:
        """Stop the commit worker thread, if any."""
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None

    def _moved(self, end: Offset) -> dict[str, Position]:
        moved = {k: p for k, p in end.shards.items() if advances(p, self._stored.get(k))}
        # A shard the offset holds as finished (listed, left the offset, a descendant in it)
        # but DynamoDB holds short of its end: written by a release that retired shards before
        # their end was committed. Its end is committed now, or a resume from DynamoDB after
        # it expires would report its records lost.
        short = [k for k, p in self._stored.items() if not p.is_shard_end and k not in end.shards]
        if short:
            finished = superseded(self._planner.listed(), set(end.shards))
            moved.update({k: Position.shard_end() for k in short if k in finished})
        return moved

    def _retired(self, end: Offset, moved: Mapping[str, Position]) -> list[str]:
        """Stored shards at ``SHARD_END`` that ``end`` no longer holds and that a resume from
        the table would still find finished, once ``moved`` is written.

        A resume starts from the stored initial positions overlaid with the table: a shard
        found there at another position would be read again, so it stays. So does one no
        child of which is committed yet (see :func:`droppable`). Without stored initial
        positions a resume resolves them anew, over every listed shard: nothing is dropped.
        """
        if self._resolved is None:
            return []
        streams = {split_shard_key(k)[0] for k in end.shards}
        candidates = []
        for key, pos in self._stored.items():
            if not pos.is_shard_end or key in end.shards or split_shard_key(key)[0] not in streams:
                continue
            initial = self._resolved.shards.get(key)
            if initial is None or initial.is_shard_end:
                candidates.append(key)
        if not candidates:
            return []
        committed = {**self._stored, **moved}
        return droppable(self._planner.listed(), committed, candidates)

    def _committed(
        self, epoch: int, moved: dict[str, Position], retired: list[str], calls: int
    ) -> None:
        self.commit_calls += calls
        self._stored.update(moved)
        for key in retired:
            self._stored.pop(key, None)
        self._notify(epoch)

    def _notify(self, epoch: int) -> None:
        if not self._callbacks:
            return
        positions: dict[tuple[str, str], str] = {}
        ended = set()
        for key, pos in self._stored.items():
            stream_shard = split_shard_key(key)
            if pos.kind == AFTER and pos.seq is not None:
                positions[stream_shard] = pos.seq
            elif pos.is_shard_end:
                ended.add(stream_shard)
        info = CommitInfo(
            application=self._opts.application_name,
            table=self._opts.checkpoint_table,
            epoch=epoch,
            committed_at=datetime.now(timezone.utc),
            positions=MappingProxyType(positions),
            ended=frozenset(ended),
        )
        for callback in self._callbacks:
            try:
                callback(info)
            except Exception as exc:
                name = getattr(callback, "__qualname__", repr(callback))
                if self._opts.on_commit_errors == "log":
                    log.exception("commit callback %s raised; going on (onCommitErrors=log)", name)
                    continue
                raise CommitCallbackError(
                    f"Commit callback {name} raised {type(exc).__name__}: {exc} (the positions "
                    "were committed to DynamoDB; set onCommitErrors=log to log and go on)"
                ) from exc
