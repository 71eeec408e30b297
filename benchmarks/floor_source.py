"""The floor of any Python streaming source: ``format("python-floor")`` has new data at every
trigger (its offset is a counter) and reads one row per partition without any I/O. Its batches/s
is what the Python Data Source API itself allows (helper round trips, Python tasks), so the
per-batch benchmark can tell Spark's share of kinesis-ddb's time per batch from ours.
Option ``numPartitions`` (default 4).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from kinesis_source.executor.arrow import SCHEMA_DDL


class FloorDataSource(DataSource):
    """``format("python-floor")``."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return "python-floor"

    def schema(self) -> str:
        """kinesis-ddb's schema, so the sink does the same work per row."""
        return SCHEMA_DDL

    def streamReader(self, schema: Any) -> FloorReader:
        """The reader."""
        lower = {k.lower(): v for k, v in self.options.items()}
        return FloorReader(int(lower.get("numpartitions", 4)))


class FloorReader(DataSourceStreamReader):
    """A new batch at every ``latestOffset``; one row per partition."""

    def __init__(self, partitions: int) -> None:
        self._partitions = partitions
        self._n = 0

    def initialOffset(self) -> dict:
        """Batch counter 0."""
        return {"n": 0}

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        """One more than last time: always new data."""
        self._n += 1
        return {"n": self._n}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        """``numPartitions`` partitions."""
        return [InputPartition(i) for i in range(self._partitions)]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        """One row, no I/O."""
        yield (b"x", "floor", f"shard-{partition.value}", "k", "1", 0, None)

    def commit(self, end: dict) -> None:
        """Nothing to store."""
