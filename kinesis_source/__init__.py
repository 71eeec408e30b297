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

    if on_commit is None:
        spark.dataSource.register(KinesisDataSource)
        return

    # A class made here is pickled by value (cloudpickle), carrying the callback with it.
    callback = on_commit

    class KinesisDataSourceWithCallback(KinesisDataSource):
        commit_callback = staticmethod(callback)

    spark.dataSource.register(KinesisDataSourceWithCallback)
