"""The Spark glue of the sink: ``DataSourceWriter`` (batch) and ``DataSourceStreamWriter``
(streaming) for ``format("kinesis-ddb")``.

On the driver, ``writer()``/``streamWriter()`` (:func:`make_writer`) check the options, the
columns and the stream (one ``ListShards``, which also gives the shard map the tasks start
from) before any task runs, so a bad write fails having written nothing. Each task then writes
its partition (:class:`~kinesis_source.sink.putter.Putter`) and returns its
:class:`SinkCommitMessage`; the driver's ``commit`` sums them up in its log. Writes are at least
once: a retried task, or a micro-batch Spark runs again after a failure, writes its rows again
(docs/sink.md says how to de-duplicate downstream).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamWriter, WriterCommitMessage

from kinesis_source.errors import SinkInputError, WriteCallbackError
from kinesis_source.sink.options import SinkOptions
from kinesis_source.sink.putter import Putter, WriteReport
from kinesis_source.sink.rows import Columns, check_schema, from_arrow, from_rows
from kinesis_source.sink.shards import ShardMap

try:  # pyspark >= 4.1: streaming writes get Arrow batches too
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase

    _STREAM_ARROW = True
except ImportError:  # pyspark 4.0: rows
    _StreamWriterBase = DataSourceStreamWriter  # type: ignore[misc,assignment]
    _STREAM_ARROW = False

log = logging.getLogger(__name__)

# Keys Spark puts into a streaming writer's options for its own use.
_SPARKS_KEYS = frozenset({"checkpointlocation"})


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """What one task wrote."""

    report: WriteReport


@dataclass(frozen=True)
class WriteInfo:
    """What an ``onWrite`` callback receives once a batch write, or a micro-batch, has written
    all its rows (every task's figures summed)."""

    stream: str
    batch_id: int | None  # the micro-batch; None for a batch write
    tasks: int
    rows: int
    records: int  # Kinesis records (fewer than rows when aggregating)
    bytes: int
    requests: int
    refused: Mapping[str, int]  # error code -> records refused (and sent again)
    rerouted_rows: int  # aggregated rows sent again after a reshard


def make_writer(
    options: dict[str, str], schema: Any, overwrite: bool, streaming: bool, callback: Callable[..., Any] | None = None
) -> _Writer:
    """Check the options, the columns and the stream on the driver; the writer for the tasks
    (``callback``: one given to ``register(spark, on_write=...)``)."""
    from kinesis_source.aws.clients import AwsSettings

    opts = SinkOptions.parse({k: v for k, v in options.items() if k.lower() not in _SPARKS_KEYS})
    if overwrite:
        how = "outputMode('append')" if streaming else "mode('append')"
        raise SinkInputError(
            f"Kinesis stream '{opts.stream}' can only be appended to: write with {how} (a stream's "
            "records cannot be replaced)."
        )
    columns = check_schema(schema, opts.stream)
    client = AwsSettings.for_kinesis(opts).failing_fast().boto3_client("kinesis")
    shards = ShardMap.load(client, opts.stream)
    if opts.on_write:
        from kinesis_source.option_values import import_function

        import_function(opts.on_write, "onWrite", "this driver")  # a bad path fails here, not after the write
    cls = KinesisStreamWriter if streaming else KinesisBatchWriter
    return cls(opts, columns, shards, callback)


class _Writer:
    """What the batch and the streaming writer share: the task's write and the summary."""

    def __init__(
        self, opts: SinkOptions, columns: Columns, shards: ShardMap, callback: Callable[..., Any] | None = None
    ) -> None:
        self._opts = opts
        self._columns = columns
        self._shards = shards
        self._callback = callback

    def _write(self, rows: Iterator[Any], arrow: bool) -> SinkCommitMessage:
        from kinesis_source.aws.clients import AwsSettings, shared_client

        client = shared_client(AwsSettings.for_kinesis(self._opts), "kinesis")
        parse = from_arrow if arrow else from_rows
        records = parse(rows, self._columns, self._opts.stream)
        return SinkCommitMessage(Putter(client, self._opts, self._shards).write(records))

    def _summary(self, messages: list[Any]) -> WriteReport:
        total = WriteReport()
        for message in messages:
            if isinstance(message, SinkCommitMessage):
                total.add(message.report)
        return total

    def _committed(self, what: str, messages: list[Any], batch_id: int | None) -> None:
        """Log what the write did and tell the callbacks."""
        total = self._summary(messages)
        self._log(what, total, len(messages))
        info = WriteInfo(
            stream=self._opts.stream, batch_id=batch_id, tasks=len(messages), rows=total.rows,
            records=total.records, bytes=total.bytes, requests=total.requests,
            refused=MappingProxyType(dict(total.refused)), rerouted_rows=total.rerouted_rows,
        )
        callbacks = [self._callback] if self._callback else []
        if self._opts.on_write:
            from kinesis_source.option_values import import_function

            callbacks.append(import_function(self._opts.on_write, "onWrite", "Spark's driver-side Python process"))
        for callback in callbacks:
            try:
                callback(info)
            except Exception as exc:
                name = getattr(callback, "__qualname__", repr(callback))
                raise WriteCallbackError(
                    f"Write callback {name} raised {type(exc).__name__}: {exc} ({what.lower()}'s "
                    f"{total.rows} rows were written to Kinesis stream '{self._opts.stream}')"
                ) from exc

    def _log(self, what: str, total: WriteReport, tasks: int) -> None:
        refused = ", ".join(f"{code} x{n}" for code, n in sorted(total.refused.items())) or "none"
        log.info(
            "%s: %d rows written to Kinesis stream %s as %d records (%d bytes) in %d PutRecords "
            "requests by %d tasks; records refused and retried: %s; aggregated rows sent again "
            "after a reshard: %d",
            what, total.rows, self._opts.stream, total.records, total.bytes, total.requests,
            tasks, refused, total.rerouted_rows,
        )

    def _log_abort(self, what: str, messages: list[Any]) -> None:
        total = self._summary(messages)
        log.warning(
            "%s failed: the tasks that finished wrote %d rows to Kinesis stream %s; they stay "
            "written (a stream cannot take records back) and are written again if the write is "
            "retried",
            what, total.rows, self._opts.stream,
        )


class KinesisBatchWriter(_Writer, DataSourceArrowWriter):
    """``df.write.format("kinesis-ddb")``: every partition's rows into the stream."""

    def write(self, iterator: Iterator[Any]) -> SinkCommitMessage:
        """Write one partition (Arrow record batches); runs on an executor."""
        return self._write(iterator, arrow=True)

    def commit(self, messages: list[Any]) -> None:
        """Log what the write did (driver)."""
        self._committed("Batch write", messages, None)

    def abort(self, messages: list[Any]) -> None:
        """Log what a failed write left written (driver)."""
        self._log_abort("Batch write", messages)


class KinesisStreamWriter(_Writer, _StreamWriterBase):
    """``df.writeStream.format("kinesis-ddb")``: each micro-batch's rows into the stream."""

    def write(self, iterator: Iterator[Any]) -> SinkCommitMessage:
        """Write one partition of a micro-batch; runs on an executor."""
        return self._write(iterator, arrow=_STREAM_ARROW)

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - Spark's name
        """Log what the micro-batch wrote (driver)."""
        self._committed(f"Micro-batch {batchId}", messages, batchId)

    def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - Spark's name
        """Log what a failed micro-batch left written (driver)."""
        self._log_abort(f"Micro-batch {batchId}", messages)
