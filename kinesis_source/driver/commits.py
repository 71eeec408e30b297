"""When positions reach DynamoDB, and the commit callbacks.

Lives in Spark's driver-side Python helper next to the planner; the application it writes for
(claimed on the first driver call) is ``application.py``'s. Positions are written

- in ``commit(end)``: Spark finished every batch up to ``end``;
- eagerly in ``latestOffset(start)``: Spark asks for a new end only once every earlier batch is
  committed to the sink, while ``commit`` lags one batch and never comes for a run's last batch.
  When a batch follows, that write goes on after ``latestOffset`` returns, beside Spark's own
  offset-log write, and the batch's ``partitions`` waits for it
  (:meth:`Checkpointer.before_batch`): a fenced query still stops before it reads. When none
  follows, ``latestOffset`` waits for it (:meth:`Checkpointer.after_planning`): Spark never
  calls ``stop()``, so nothing else would before a run that ends there.

With ``checkpointIntervalMs``, a write comes at most that often: the batches finished in
between are written together by the next one, by a ``latestOffset`` that plans no batch (an
idle trigger, a run's end) and by ``stop()`` where it is called (Spark ends the helper of a
Python stream without it: a query stopped while records flow leaves up to the interval unwritten).

Only positions that move a shard forward are written; each write is fenced by the epoch. A
shard at ``SHARD_END`` that the offset has retired is dropped from the table in the same write
once a child of it is committed, unless the stored initial positions would bring it back on a
resume: the table holds the live shards, not every shard the stream ever had.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from kinesis_source.checkpoints.callbacks import CommitInfo, commit_info, load_callback, notify
from kinesis_source.checkpoints.format import advances
from kinesis_source.driver.application import Application
from kinesis_source.lineage import droppable, superseded
from kinesis_source.positions import Offset, Position, ShardId

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Write:
    """An eager write under way: what it writes, and its ``TransactWriteItems`` calls when done
    (nothing moved nor retired: only the epoch check before a batch)."""

    epoch: int
    moved: dict[ShardId, Position]
    retired: list[ShardId]
    calls: Future[int]


class Checkpointer:
    """Writes the positions of finished batches to DynamoDB (fenced by the run's epoch) and
    runs the commit callbacks."""

    def __init__(
        self,
        app: Application,
        callback: Callable[[CommitInfo], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._app = app
        self._clock = clock
        self._last_write: float | None = None
        self._finished: Offset | None = None  # every batch up to it is in the sink
        self._starts_seen = False  # latestOffset gets its start (pyspark >= 4.2): it sets _finished
        self._deferred = False  # positions of finished batches not written for the interval
        self._opts = app.opts
        self._callbacks = [callback] if callback else []
        if app.opts.on_commit:
            self._callbacks.append(load_callback(app.opts.on_commit))
        self._first_start_seen = False
        self._fence_checked = False
        self._writer: ThreadPoolExecutor | None = None
        self._pending: _Write | None = None
        self.commit_calls = 0

    @property
    def app(self) -> Application:
        """The application this checkpointer writes for."""
        return self._app

    # -- commits -------------------------------------------------------------------------

    @contextmanager
    def committing(self, start: Offset) -> Iterator[None]:
        """``with committing(start):`` around ``latestOffset(start)``'s probe: every batch up
        to ``start`` is in the sink, so it is committed while the probe finds the next end.

        The write and the probe are independent (one goes to DynamoDB, the other to Kinesis),
        so the write runs in a worker thread, and it is left running when the block ends:
        Spark writes its offset log next, and :meth:`settle` (the batch's ``partitions``, or
        the driver's next call) waits for the write and raises its failure. When the probe
        fails, the write is settled first: its own failure (e.g. fenced) is the one reported.
        """
        self.settle()
        epoch = self._app.claim()
        if not self._first_start_seen:
            self._first_start_seen = True
            ahead = [
                k for k, stored in self._app.stored.items()
                if k in start.shards and advances(stored, start.shards[k])
            ]
            if ahead:
                log.warning(
                    "DynamoDB (application %s, table %s) is ahead of Spark's checkpoint for %d "
                    "shard(s), e.g. %s: Spark's offsets win; those records are read again",
                    self._opts.application_name, self._opts.checkpoint_table, len(ahead), ahead[0],
                )
        self._finished, self._starts_seen = start, True
        moved = self._moved(start)
        retired = self._retired(start, moved)
        self._fence_checked = False
        if not moved and not retired or self._defer():
            yield
            return
        calls = self._worker().submit(self._app.store.commit, epoch, self._app.owner, moved, retired)
        self._pending = _Write(epoch, moved, retired, calls)
        try:
            yield
        except BaseException:
            self.settle()
            raise

    def settle(self) -> None:
        """Wait for the eager write, if one is under way: record it, or raise its failure (its
        positions then count as unwritten, and the next commit writes them again)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        calls = pending.calls.result()
        if pending.moved or pending.retired:
            self._committed(pending.epoch, pending.moved, pending.retired, calls)
        self._fence_checked = True  # the write's transaction (or the check) read the epoch

    def after_planning(self, batch_follows: bool) -> None:
        """``latestOffset`` is returning: its write goes on only if a batch follows.

        With no batch, the write is waited for now: no ``partitions`` or ``commit`` would wait
        for it, and Spark never calls ``stop()``, so a run that ends here (AvailableNow, a stop
        once all is read) would lose it with the helper. With a batch, the epoch must be
        checked before it reads: unless this call's write does it, a consistent read starts
        now, beside Spark's offset-log write, and :meth:`before_batch` waits for it (so a batch
        after a trigger that found nothing new does not pay DynamoDB's round trip there)."""
        if not batch_follows:
            self.settle()
            self._flush()
            return
        if self._pending is not None or self._fence_checked:
            return
        epoch = self._app.claim()
        check = self._worker().submit(self._checked, epoch)
        self._pending = _Write(epoch, {}, [], check)

    def _checked(self, epoch: int) -> int:
        self._app.store.check_epoch(epoch)
        return 0

    def _worker(self) -> ThreadPoolExecutor:
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="kinesis-ddb-commit")
        return self._writer

    def before_batch(self) -> None:
        """A batch's tasks are about to be planned: make sure no newer query owns the
        application, so a fenced query stops before reading more. The eager write of the
        ``latestOffset`` before checked it in its transaction, or :meth:`after_planning` started
        a check (either waited for here); else (a replayed batch after a restart) one
        consistent read."""
        self.settle()
        if self._fence_checked:
            self._fence_checked = False
            return
        self._app.store.check_epoch(self._app.claim())

    def commit(self, end: Offset) -> None:
        """Write the shards of ``end`` that moved forward, then call the callbacks."""
        self.settle()
        if not self._starts_seen:  # else latestOffset's start, at or past ``end``
            self._finished = end
        if not self._defer():
            self._write(end)

    def _defer(self) -> bool:
        """True when the commit interval has not passed since the last write (what is not
        written now is by a later one)."""
        interval = self._opts.checkpoint_interval_ms / 1000
        if interval <= 0 or self._last_write is None:
            return False
        if self._clock() - self._last_write >= interval:
            return False
        self._deferred = True
        return True

    def _write(self, end: Offset) -> None:
        epoch = self._app.claim()
        moved = self._moved(end)
        retired = self._retired(end, moved)
        if moved or retired:
            calls = self._app.store.commit(epoch, self._app.owner, moved, retired)
            self._committed(epoch, moved, retired, calls)

    def _flush(self) -> None:
        """Write what the commit interval held back, now."""
        if self._deferred and self._finished is not None:
            self._write(self._finished)

    def close(self) -> None:
        """Wait for an eager write under way (a failure is logged: the query is stopping, and
        a resume reads those records again) and stop the commit worker thread, if any."""
        try:
            self.settle()
            self._flush()
        except Exception as exc:  # noqa: BLE001 - reported, the stop goes on
            log.warning(
                "the last positions of application %s were not written to DynamoDB table %s (%s): "
                "a resume from the table reads them again",
                self._opts.application_name, self._opts.checkpoint_table, exc,
            )
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None

    def _moved(self, end: Offset) -> dict[ShardId, Position]:
        stored = self._app.stored
        # The same object as stored is the common case (the offsets Spark hands back are the
        # ones planned): no comparison needed.
        moved = {k: p for k, p in end.shards.items() if p is not stored.get(k) and advances(p, stored.get(k))}
        # A shard the offset holds as finished (listed, left the offset, a descendant in it)
        # but DynamoDB holds short of its end: written by a release that retired shards before
        # their end was committed. Its end is committed now, or a resume from DynamoDB after
        # it expires would report its records lost.
        short = [k for k, p in stored.items() if not p.is_shard_end and k not in end.shards]
        if short:
            finished = superseded(self._app.catalogue.listed(), set(end.shards))
            moved.update({k: Position.shard_end() for k in short if k in finished})
        return moved

    def _retired(self, end: Offset, moved: Mapping[ShardId, Position]) -> list[ShardId]:
        """Stored shards at ``SHARD_END`` that ``end`` no longer holds and that a resume from
        the table would still find finished, once ``moved`` is written.

        A resume starts from the stored initial positions overlaid with the table: a shard
        found there at another position would be read again, so it stays. So does one no
        child of which is committed yet (see :func:`droppable`). Without stored initial
        positions a resume resolves them anew, over every listed shard: nothing is dropped.
        """
        resolved = self._app.resolved
        if resolved is None:
            return []
        streams = end.streams
        candidates = []
        for key, pos in self._app.stored.items():
            if not pos.is_shard_end or key in end.shards or key.stream not in streams:
                continue
            initial = resolved.shards.get(key)
            if initial is None or initial.is_shard_end:
                candidates.append(key)
        if not candidates:
            return []
        committed = {**self._app.stored, **moved}
        return droppable(self._app.catalogue.listed(), committed, candidates)

    def _committed(
        self, epoch: int, moved: dict[ShardId, Position], retired: list[ShardId], calls: int
    ) -> None:
        self.commit_calls += calls
        self._last_write = self._clock()
        self._deferred = False
        self._app.stored.update(moved)
        for key in retired:
            self._app.stored.pop(key, None)
        if self._callbacks:
            opts = self._opts
            info = commit_info(opts.application_name, opts.checkpoint_table, epoch, self._app.stored)
            notify(self._callbacks, info, opts.on_commit_errors)
