"""kinesis-ddb: a Spark Structured Streaming source for Amazon Kinesis Data Streams.

``register(spark)`` makes ``spark.readStream.format("kinesis-ddb")`` available. Importing this
package needs no running Spark: the PySpark modules are imported only when registering.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__version__ = "0.1.0"
FORMAT = "kinesis-ddb"

__all__ = ["FORMAT", "register", "__version__"]


def register(spark: Any, on_commit: Callable[..., Any] | None = None) -> None:
    """Register the ``kinesis-ddb`` format on a SparkSession.

    ``on_commit(info: CommitInfo)`` is called after every DynamoDB commit. It runs in Spark's
    driver-side Python helper process, not in this process: it travels pickled with the source
    class, so it must be picklable (cloudpickle) and must not rely on this process's state.
    """
    from kinesis_source.source import KinesisDataSource

    # A class made here is pickled by value (cloudpickle), carrying what it holds with it: the
    # callback, and the cluster's parallelism (the helper that plans batches has no session).
    callback = staticmethod(on_commit) if on_commit is not None else None
    parallelism = _parallelism(spark)

    class KinesisDataSourceRegistered(KinesisDataSource):
        commit_callback = callback
        cluster_parallelism = parallelism

    spark.dataSource.register(KinesisDataSourceRegistered)


def _parallelism(spark: Any) -> int | None:
    """The session's ``defaultParallelism``; None where it has no SparkContext (Connect)."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:  # noqa: BLE001 - Spark Connect sessions raise on sparkContext
        return None
