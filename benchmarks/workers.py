"""Which Spark Python worker reads a partition, batch after batch: would a fan-out subscription
kept open in a worker (for the shard's next range) be found there again?

A Python data source of ``PARTITIONS`` partitions whose ``read`` returns its worker's process id
is read ``ROUNDS`` times on ``local[2]`` (Spark reuses its Python workers by default). Reported:
the distinct workers seen, and how often a partition ran in the same worker as in the round
before (a kept subscription would be reused only then).

    python -m benchmarks.workers
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

ROUNDS = 30
PARTITION_COUNTS = (1, 2, 4)


class _Partition(InputPartition):
    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index


class _WhereReader(DataSourceReader):
    def __init__(self, partitions: int) -> None:
        self._n = partitions

    def partitions(self) -> list[InputPartition]:
        return [_Partition(i) for i in range(self._n)]

    def read(self, partition: InputPartition) -> Iterator[tuple[int, int]]:
        yield (partition.index, os.getpid())  # type: ignore[attr-defined]


class WhereSource(DataSource):
    """``format("where")``: one row per partition, (partition, worker pid)."""

    @classmethod
    def name(cls) -> str:
        return "where"

    def schema(self) -> str:
        return "part int, pid int"

    def reader(self, schema: Any) -> DataSourceReader:
        return _WhereReader(int(self.options.get("partitions", "1")))


def measure(spark: Any, partitions: int) -> dict[str, Any]:
    """``ROUNDS`` reads of ``partitions`` partitions: workers seen and same-worker rounds."""
    rounds = []
    for _ in range(ROUNDS):
        rows = spark.read.format("where").option("partitions", str(partitions)).load().collect()
        rounds.append({r.part: r.pid for r in rows})
    same = sum(cur[p] == prev[p] for prev, cur in zip(rounds, rounds[1:], strict=False) for p in cur)
    pairs = (len(rounds) - 1) * partitions
    return {"partitions": partitions, "rounds": ROUNDS, "workers": len({pid for r in rounds for pid in r.values()}),
            "same_worker": same, "pairs": pairs, "same_worker_share": round(same / pairs, 3)}


def main() -> None:
    from benchmarks.spark_env import session

    spark = session()
    try:
        spark.dataSource.register(WhereSource)
        out = [measure(spark, n) for n in PARTITION_COUNTS]
    finally:
        spark.stop()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
