"""kinesis-ddb: a Spark Structured Streaming source for Amazon Kinesis Data Streams.

``register(spark)`` makes ``spark.readStream.format("kinesis-ddb")`` available. Importing this
package needs no running Spark: the PySpark modules are imported only when registering.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
FORMAT = "kinesis-ddb"

__all__ = ["FORMAT", "register", "__version__"]


def register(spark: Any) -> None:
    """Register the ``kinesis-ddb`` format on a SparkSession."""
    from .source import KinesisDataSource

    spark.dataSource.register(KinesisDataSource)
