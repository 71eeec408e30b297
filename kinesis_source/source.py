"""The Spark glue: ``DataSource`` and ``DataSourceStreamReader`` for ``format("kinesis-ddb")``.

Process model (see docs/architecture.md): the planning methods run in one long-lived Python
helper per query run and share the :class:`~kinesis_source.driver.planner.Planner` on ``self``;
``read`` runs in executor Python workers on an unpickled copy of another reader instance, so a
partition carries everything it needs.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, TypeVar

from pyspark.sql.datasource import DataSource, DataSourceStreamReader
from pyspark.sql.types import StructType

from kinesis_source.aws.clients import AwsSettings
from kinesis_source.errors import KinesisDdbError
from kinesis_source.executor import RangePartition, ShardRead, read_partition
from kinesis_source.executor.arrow import SCHEMA_DDL
from kinesis_source.options import SourceOptions
from kinesis_source.positions import Offset

if TYPE_CHECKING:  # driver modules load only in the driver's helper, never on executors
    from kinesis_source.driver.commits import Checkpointer
    from kinesis_source.driver.consumers import Consumers
    from kinesis_source.driver.planner import Planner
    from kinesis_source.driver.start import StartResolver

try:  # pyspark >= 4.2: admission control and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    _AVAILABLE_NOW: tuple[type, ...] = (SupportsTriggerAvailableNow,)
except ImportError:  # pyspark 4.0/4.1: Spark runs AvailableNow as one batch (docs/semantics.md)
    ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]
    _AVAILABLE_NOW = ()

log = logging.getLogger(__name__)

FORMAT_NAME = "kinesis-ddb"

M = TypeVar("M", bound=Callable[..., Any])


def surfaced(method: M) -> M:
    """An error of ours leaves a planning method with the fewest frames Spark will show.

    Spark puts the helper's whole Python traceback into the query's exception, above the
    message. The message of a :class:`KinesisDdbError` already says what failed and which option
    to change, so it is re-raised from here: the traceback then holds Spark's two frames and this
    one, and no chained second traceback (the cause's text is in the message where it helps).
    The full chain is logged at debug level in the helper.
    """

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except KinesisDdbError as exc:
            log.debug("%s failed", method.__name__, exc_info=True)
            raise exc.with_traceback(None) from None

    return wrapper  # type: ignore[return-value]


class KinesisDataSource(DataSource):
    """``spark.readStream.format("kinesis-ddb")``: a Kinesis stream read in exact ranges."""

    # Set on a subclass by ``register(spark, ...)``; they travel pickled with the class.
    commit_callback: Any = None
    write_callback: Any = None  # the sink's, from register(spark, on_write=...)
    cluster_parallelism: int | None = None  # the session's defaultParallelism (shardsPerTask)

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return FORMAT_NAME

    @surfaced
    def schema(self) -> str:
        """Fixed output schema (see executor/arrow.py). Spark asks for it in ``load()``, so the
        options are validated here too: a bad option fails ``load()``, not the running query."""
        SourceOptions.parse(dict(self.options))
        return SCHEMA_DDL

    @surfaced
    def streamReader(self, schema: StructType) -> KinesisStreamReader:
        """A planning/reading object; options are validated here, so errors come early."""
        cls = type(self)
        return KinesisStreamReader(
            SourceOptions.parse(dict(self.options)), cls.commit_callback, parallelism=cls.cluster_parallelism
        )

    @surfaced
    def writer(self, schema: StructType, overwrite: bool) -> Any:
        """``df.write.format("kinesis-ddb")``: options, columns and stream are checked here,
        on the driver, before any task writes (kinesis_source/sink/)."""
        from kinesis_source.sink.writer import make_writer

        return make_writer(dict(self.options), schema, overwrite, streaming=False, callback=type(self).write_callback)

    @surfaced
    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        """``df.writeStream.format("kinesis-ddb")``: as :meth:`writer`, once per query run."""
        from kinesis_source.sink.writer import make_writer

        return make_writer(dict(self.options), schema, overwrite, streaming=True, callback=type(self).write_callback)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class KinesisStreamReader(DataSourceStreamReader, *_AVAILABLE_NOW):  # type: ignore[misc]
    """Plans exact ranges on the driver, replays them on executors."""

    def __init__(
        self,
        opts: SourceOptions,
        callback: Any = None,
        planner: Planner | None = None,
        parallelism: int | None = None,
    ) -> None:
        """``planner``: one to use instead of one made on the first driver call (tests);
        ``parallelism``: the cluster's, if known (how many shards a task reads by default)."""
        self._opts = opts
        self._callback = callback
        self._parallelism = parallelism
        # Made on first driver call: the reader is pickled right after __init__.
        self._planner: Planner | None = planner
        self._checkpointer: Checkpointer | None = None
        self._start: StartResolver | None = None
        self._consumers: Consumers | None = None
        # The end of the newest batch Spark knows of: what latestOffset returned last, or the
        # end partitions() was last given. pyspark < 4.2 passes latestOffset no start; after a
        # restart it calls partitions(end, end) with its offset log's newest end first.
        self._known_end: Offset | None = None
        # Offsets Spark handed back as dicts, parsed: Spark's next start is the end this reader
        # returned last, so parsing (O(shards) in Python) happens once per offset, not per call.
        self._parsed: list[tuple[dict, Offset]] = []
        # The last batch planned: (start, end) and its partitions.
        self._planned: tuple[tuple[Offset, Offset], list[RangePartition]] | None = None

    def _offset(self, data: dict) -> Offset:
        """``data`` (an offset Spark handed back) parsed, reusing the Offset it came from."""
        for known, offset in self._parsed:
            if known == data:
                return offset
        return self._remember(Offset.from_dict(data), data)

    def _remember(self, offset: Offset, data: dict) -> Offset:
        self._parsed = [(data, offset), *self._parsed[:1]]
        return offset

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_planner"] = None
        state["_checkpointer"] = None
        state["_planned"] = None
        state["_start"] = None
        state["_consumers"] = None
        state["_known_end"] = None
        state["_parsed"] = []
        return state

    def __repr__(self) -> str:
        return f"KinesisStreamReader(streams={list(self._opts.stream_names)})"

    @property
    def planner(self) -> Planner:
        """The run's planner, created lazily in the driver-side helper process."""
        if self._planner is None:
            from kinesis_source.driver.planner import Planner

            self._planner = Planner(self._opts)
        return self._planner

    def _claimable(self) -> None:
        """The run's application (claimed on first use), its start and its commits, made
        together in the driver-side helper."""
        from kinesis_source.driver.application import Application
        from kinesis_source.driver.commits import Checkpointer
        from kinesis_source.driver.start import StartResolver

        app = Application.for_options(self._opts, self.planner)
        self._start = StartResolver(app)
        self._checkpointer = Checkpointer(app, self._callback)

    @property
    def checkpointer(self) -> Checkpointer:
        """The run's DynamoDB commits, created lazily in the driver-side helper."""
        if self._checkpointer is None:
            self._claimable()
        assert self._checkpointer is not None
        return self._checkpointer

    @property
    def start(self) -> StartResolver:
        """Where the run starts, and where streams added since Spark's checkpoint enter."""
        if self._start is None:
            self._claimable()
        assert self._start is not None
        return self._start

    @surfaced
    def initialOffset(self) -> dict:
        """Where a query without a Spark checkpoint starts: committed positions in DynamoDB,
        else the stored or given initial position (resolved once and stored)."""
        return self.start.initial_offset().to_dict()

    @surfaced
    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        """Exact end of the next batch, or ``start`` when nothing new arrived.

        Every batch up to ``start`` is in the sink when Spark calls this, so ``start`` is
        committed to DynamoDB while the probe runs (when a batch follows, the write goes on
        after this returns and the batch's ``partitions`` waits for it). pyspark < 4.2 calls
        this without ``start``: the probe then starts from the end of the newest batch Spark
        knows of (the end ``partitions`` was last given, which after a restart pyspark announces
        first, or the end this reader returned last; else the initial positions), never from
        DynamoDB's position one batch behind it.
        """
        planner = self.planner
        max_records = self._max_records(limit)
        if start is not None:
            begin = self._offset(start)
        else:
            begin = self._known_end or self.start.initial_offset()
        entering = self.start.entering(begin)
        if self._opts.holds_subscriptions:
            planner.subscribe_with(self._consumer_arns())
        # (without ``start`` nothing is known to be in the sink: no commit)
        with self.checkpointer.committing(begin) if start is not None else nullcontext():
            if entering:
                # Streams added since Spark's checkpoint was made enter at their start
                # positions in a batch of their own (see plan_ranges), before any is read.
                end = Offset({**begin.shards, **entering})
            else:
                end = planner.latest_offset(begin, max_records)
        self.checkpointer.after_planning(batch_follows=end != begin)
        self._known_end = end
        out = end.to_dict()
        self._remember(end, end.to_dict())
        return out

    def _max_records(self, limit: Any) -> int | None:
        """The batch's record limit: Spark's (``ReadAllAvailable`` for Trigger.Once means none),
        else ``maxRecordsPerBatch`` (pyspark < 4.2 passes no limit)."""
        if ReadAllAvailable is not None and isinstance(limit, ReadAllAvailable):
            return None
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            return max(1, int(limit.max_rows))
        return self._opts.max_records_per_batch

    def getDefaultReadLimit(self) -> Any:
        """``ReadMaxRows(maxRecordsPerBatch)`` when the option is set, else no limit."""
        if self._opts.max_records_per_batch is None:
            return ReadAllAvailable()
        return ReadMaxRows(self._opts.max_records_per_batch)

    @surfaced
    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: fix the target (every shard's newest record now); later
        batches never pass it and the run stops when all shards reached it."""
        self.planner.prepare_available_now()

    def reportLatestOffset(self) -> dict | None:
        """Probe and commit counters, shown in ``StreamingQueryProgress.sources[].latestOffset``."""
        if self._planner is None:
            return None
        stats = self._planner.stats()
        if self._checkpointer is not None:
            stats["ddbCommitCalls"] = self._checkpointer.commit_calls
        return stats

    @surfaced
    def partitions(self, start: dict, end: dict) -> list[RangePartition]:
        """The shard ranges that hold records, grouped into tasks (``shardsPerTask``); first,
        the check that no newer query owns the application (a fenced query stops before it
        reads), with the eager DynamoDB write of ``latestOffset`` waited for.

        Asked again for the same batch, it returns the same partitions: their ranges were
        handed out (fan-out's held records taken, executor reads booked). Spark's scan may plan
        a batch more than once (``planInputPartitions`` says so); pyspark 4.0's
        ``foreachBatch`` with two actions plans once, as measured."""
        key = (self._offset(start), self._offset(end))
        if self._planned is not None and self._planned[0] == key:
            return self._planned[1]
        self.checkpointer.before_batch()
        from kinesis_source.driver.planner import plan_ranges
        from kinesis_source.driver.tasks import group, shards_per_task

        settings = AwsSettings.for_kinesis(self._opts).pacing_reads()
        if self._opts.consumer_mode == "efo":
            settings = settings.silent_for_at_most(self._opts.subscribe_timeout_ms / 1000)
        self._known_end = self._offset(end)
        ranges = plan_ranges(self._offset(start), self._known_end)
        arns = self._consumer_arns() if ranges and self._opts.consumer_mode == "efo" else {}
        hashes = self.planner.hash_ranges() if ranges else {}
        booked, report_to = self.planner.hand_over(ranges) if ranges else ({}, None)
        unplanned = (None, 0.0, None, None, None, (), None)
        reads = []
        for r in ranges:
            booking = booked.get(r.shard, unplanned)
            # (fan-out: a range the driver's subscription received goes whole, read by no call)
            arn = arns.get(r.stream) if not booking[5] else None
            reads.append(ShardRead(r, arn, hashes.get(r.shard), *booking))
        per_task = shards_per_task(len(reads), self._opts.shards_per_task, self._parallelism)
        planned = [RangePartition.of(task, settings, self._opts, report_to) for task in group(reads, per_task)]
        self._planned = (key, planned)
        return planned

    def _consumer_arns(self) -> dict[str, str]:
        """Each stream's EFO consumer ARN (registered and waited for on first use)."""
        if self._consumers is None:
            from kinesis_source.driver.consumers import Consumers

            self._consumers = Consumers(self._opts, self.checkpointer.app)
        return self._consumers.arns()

    def read(self, partition: RangePartition) -> Iterator[Any]:  # type: ignore[override]
        """Replay a task's ranges, each in order, as Arrow batches (runs on an executor)."""
        return read_partition(partition)

    @surfaced
    def commit(self, end: dict) -> None:
        """Spark finished every batch up to ``end``: write it to DynamoDB (fenced)."""
        self.checkpointer.commit(self._offset(end))

    def stop(self) -> None:
        """Release the driver's client, event loop and commit thread, and leave the EFO consumers."""
        if self._planner is not None:
            self._planner.close()
        if self._checkpointer is not None:
            self._checkpointer.close()
        if self._consumers is not None:
            self._consumers.release()
