"""``format("kinesis-ddb")`` with no ``register(spark)`` call.

PySpark 4 looks, in every Python process that plans data sources, for top-level modules named
``pyspark_*`` that define ``DefaultSource`` (``pyspark/sql/worker/lookup_data_sources.py``) and
registers each under its ``name()``. This module, installed with the package, is that entry.
``kinesis_source.register(spark)`` still works, and a session's registration wins over this one
(it is how a commit callback is given).
"""

from kinesis_source.source import KinesisDataSource as DefaultSource

__all__ = ["DefaultSource"]
