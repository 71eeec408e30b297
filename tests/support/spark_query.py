"""Running real streaming queries in tests and observing what reached the sink."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Row:
    """What a test needs of one output row."""

    shard_id: str
    seq: str
    data: bytes
    stream: str
    partition_key: str = ""
    sub_seq: int = 0


@dataclass
class Collector:
    """A foreachBatch sink that records every delivery of every batch, in order.

    ``fail_batches`` makes the sink raise after recording those batch ids (once each), which
    stops the query after Spark wrote ``offsets/N`` and before ``commits/N``.
    """

    fail_batches: set[int] = field(default_factory=set)
    deliveries: list[tuple[int, list[Row]]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = [
            Row(
                r["shardId"],
                r["sequenceNumber"],
                bytes(r["data"]),
                r["streamName"],
                r["partitionKey"],
                r["subSequenceNumber"],
            )
            for r in df.collect()
        ]
        with self._lock:
            self.deliveries.append((batch_id, rows))
        if batch_id in self.fail_batches:
            self.fail_batches.discard(batch_id)
            raise RuntimeError(f"test sink fails batch {batch_id} on purpose")

    def rows(self) -> list[Row]:
        """Every row delivered, in delivery order."""
        with self._lock:
            return [row for _, rows in self.deliveries for row in rows]

    def count(self) -> int:
        """Rows delivered so far."""
        return len(self.rows())

    def batches(self, batch_id: int) -> list[list[Row]]:
        """Each delivery of one batch id."""
        with self._lock:
            return [rows for bid, rows in self.deliveries if bid == batch_id]


def start_query(
    spark: Any,
    options: dict[str, str],
    checkpoint: Path,
    sink: Collector,
    trigger_ms: int = 200,
) -> Any:
    """Start ``format("kinesis-ddb")`` with ``options`` into ``sink``."""
    return start_triggered(
        spark, options, checkpoint, sink, processingTime=f"{trigger_ms} milliseconds"
    )


def start_triggered(
    spark: Any, options: dict[str, str], checkpoint: Path, sink: Collector, **trigger: Any
) -> Any:
    """Start a query into ``sink`` with a trigger such as ``availableNow=True``."""
    reader = spark.readStream.format("kinesis-ddb")
    for key, value in options.items():
        reader = reader.option(key, value)
    return (
        reader.load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(**trigger)
        .start()
    )


def read_available_now(spark: Any, options: dict[str, str], checkpoint: Path, timeout_s: float = 240) -> Collector:
    """Run a ``Trigger.AvailableNow`` query to its end (it must stop by itself, without an
    error, within ``timeout_s``) and return what its sink got."""
    return read_to_end(spark, options, checkpoint, timeout_s, availableNow=True)


def read_to_end(spark: Any, options: dict[str, str], checkpoint: Path, timeout_s: float, **trigger: Any) -> Collector:
    """Run a query with a trigger that ends by itself (``availableNow=True``, ``once=True``) to
    its end, without an error, within ``timeout_s``; return what its sink got."""
    sink = Collector()
    query = start_triggered(spark, options, checkpoint, sink, **trigger)
    try:
        assert query.awaitTermination(timeout_s), f"the query ({trigger}) did not stop by itself"
        assert query.exception() is None
    finally:
        stop_quietly(query)
    return sink


def offsets_logged(checkpoint: Path) -> set[int]:
    """Batch ids present in the checkpoint's offset log."""
    return {int(p.name) for p in (checkpoint / "offsets").glob("[0-9]*")}


def commits_logged(checkpoint: Path) -> set[int]:
    """Batch ids present in the checkpoint's commit log."""
    return {int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")}


def stop_quietly(query: Any) -> None:
    """Stop a query that may already have failed."""
    try:
        query.stop()
    except Exception:  # noqa: BLE001 - a failed query raises its failure again on stop
        pass


def source_report(progress: Any) -> dict:
    """The source's ``reportLatestOffset()`` dict from one progress event."""
    import json

    value = progress["sources"][0]["latestOffset"]
    return json.loads(value) if isinstance(value, str) else value


def probes_of(query: Any) -> int:
    """How many probes the query's source has made, as of its last progress (0 before one)."""
    progress = query.lastProgress
    return source_report(progress)["probes"] if progress else 0


@contextmanager
def running(
    spark: Any, options: dict[str, str], checkpoint: Path, sink: Collector | None = None, **kw: Any
) -> Iterator[tuple[Any, Collector]]:
    """Start a query for the ``with`` block and stop it afterwards, whatever happened."""
    sink = sink if sink is not None else Collector()
    query = start_query(spark, options, checkpoint, sink, **kw)
    try:
        yield query, sink
    finally:
        stop_quietly(query)


def failure_of(spark: Any, options: dict[str, str], checkpoint: Path) -> str:
    """Run a query that must fail; return its error message."""
    from tests.support.waiting import wait_for

    with running(spark, options, checkpoint) as (query, _):
        wait_for(lambda: not query.isActive, timeout=90, what="the query to fail")
        return str(query.exception())
