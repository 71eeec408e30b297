"""The floor of any Python streaming source: ``format("python-floor")`` has new data at every
trigger (its offset is a counter) and reads one row per partition without any I/O. Its batches/s
is what the Python Data Source API itself allows (helper round trips, Python tasks), so the
per-batch benchmark can tell Spark's share of kinesis-ddb's time per batch from ours.
Option ``numPartitions`` (default 4) may be fractional: batches then alternate between the two
whole numbers around it so that their mean is it (1.7: 2, 2, 1, 2, 1, 2, 2, 1, 2, 2, ...), as
kinesis-ddb's batches read ranges only for the shards whose tip moved.
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
        return FloorReader(float(lower.get("numpartitions", 4)))


class FloorReader(DataSourceStreamReader):
    """A new batch at every ``latestOffset``; one row per partition."""

    def __init__(self, partitions: float) -> None:
        self._partitions = partitions
        self._n = 0
        self._planned = 0  # batches planned so far

    def initialOffset(self) -> dict:
        """Batch counter 0."""
        return {"n": 0}

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        """One more than last time: always new data."""
        self._n += 1
        return {"n": self._n}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        """``numPartitions`` partitions (on average, when it is fractional)."""
        k, p = self._planned, self._partitions
        self._planned += 1
        count = max(1, round((k + 1) * p) - round(k * p))
        return [InputPartition(i) for i in range(count)]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        """One row, no I/O."""
        yield (b"x", "floor", f"shard-{partition.value}", "k", "1", 0, None)

    def commit(self, end: dict) -> None:
        """Nothing to store."""
