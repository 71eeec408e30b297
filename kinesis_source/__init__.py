"""kinesis-ddb: a Spark Structured Streaming source for Amazon Kinesis Data Streams.

Installed in the Python environment Spark runs, ``spark.readStream.format("kinesis-ddb")`` is
available by itself (PySpark registers the ``DefaultSource`` of the top-level module
``pyspark_kinesis_ddb``); ``register(spark)`` does it explicitly, with a commit callback, the
cluster's parallelism and the ``--py-files`` route. Importing this package needs no running
Spark: the PySpark modules are imported only when registering.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__version__ = "0.1.0"
FORMAT = "kinesis-ddb"

__all__ = ["FORMAT", "register", "__version__"]


def register(
    spark: Any, on_commit: Callable[..., Any] | None = None, on_write: Callable[..., Any] | None = None
) -> None:
    """Register the ``kinesis-ddb`` format on a SparkSession.

    ``on_commit(info: CommitInfo)`` is called after every DynamoDB commit of a read;
    ``on_write(info: WriteInfo)`` after every batch write or micro-batch the sink wrote. They run
    in Spark's driver-side Python processes, not in this process: they travel pickled with the
    source class, so they must be picklable (cloudpickle) and must not rely on this process's
    state.
    """
    from kinesis_source.source import KinesisDataSource

    # A class made here is pickled by value (cloudpickle), carrying what it holds with it: the
    # callback, and the cluster's parallelism (the helper that plans batches has no session).
    callback = staticmethod(on_commit) if on_commit is not None else None
    written = staticmethod(on_write) if on_write is not None else None
    parallelism = _parallelism(spark)

    class KinesisDataSourceRegistered(KinesisDataSource):
        commit_callback = callback
        write_callback = written
        cluster_parallelism = parallelism

    _share_zip_path(spark)
    try:
        spark.dataSource.register(KinesisDataSourceRegistered)
    except Exception as exc:
        if "DATA_SOURCE_ALREADY_EXISTS" not in str(exc):
            raise
        # pyspark 4.0 refuses to replace a format it registered from pyspark_kinesis_ddb (4.3
        # replaces it). The registered source is this one; only what register() adds is lost.
        if on_commit is not None or on_write is not None:
            from kinesis_source.errors import OptionError

            which, option = ("on_commit", "onCommit") if on_commit is not None else ("on_write", "onWrite")
            raise OptionError(
                "This pyspark cannot replace the format 'kinesis-ddb' it registered by itself "
                f"(module pyspark_kinesis_ddb), so register(spark, {which}=...) cannot attach "
                f"the callback: give it with option '{option}' ('module:function') instead"
            ) from None


def _share_zip_path(spark: Any) -> None:
    """When this package was imported from a zip (``spark-submit --py-files``), put the zip on
    the ``PYTHONPATH`` Spark gives the Python processes of what is registered next.

    Spark's streaming-source helper, which plans batches on the driver, is not given the
    ``--py-files`` includes that task workers get (measured on pyspark 4.3), so it could not
    unpickle the source class. Spark passes ``SparkContext.environment`` with every Python
    function it registers and merges its ``PYTHONPATH`` into the helper's. Nothing changes for a
    package installed in the interpreter's own environment.
    """
    import os
    import zipimport

    if not isinstance(globals().get("__loader__"), zipimport.zipimporter):
        return
    archive = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        env = spark.sparkContext.environment
    except Exception:  # noqa: BLE001 - Spark Connect sessions raise on sparkContext
        return
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if archive not in paths:
        env["PYTHONPATH"] = os.pathsep.join([archive, *paths])


def _parallelism(spark: Any) -> int | None:
    """The session's ``defaultParallelism``; None where it has no SparkContext (Connect)."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:  # noqa: BLE001 - Spark Connect sessions raise on sparkContext
        return None
