"""A Spark driver in its own process, for the demo and for tests that SIGKILL it mid-batch.

    python -m kinesis_source.tools.demo_driver --run R --out DIR --checkpoint DIR --option k=v ...

Reads ``format("kinesis-ddb")`` into a parquet sink: each batch with rows is written by Spark to
``<out>/<run>-<batchId>.parquet``, then ``<out>/<run>.status.json`` is rewritten with the totals
so far. When the file ``<out>/<run>.block`` exists (or ``--block-at-rows`` is reached), the next
batch with rows is written and the sink then blocks forever with a ``<out>/<run>.blocked`` marker
naming the batch: the caller kills
the process while that batch is in flight (written, not committed).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

Row = tuple[str, str, int, bytes]  # shardId, sequenceNumber, subSequenceNumber, data


class DriverProcess:
    """The caller's handle on one driver run (its own process group, so SIGKILL takes the JVM
    and the Python workers with it)."""

    def __init__(
        self,
        run: str,
        out: Path,
        checkpoint: Path,
        options: Mapping[str, str],
        block_at_rows: int = 0,
    ) -> None:
        self.run, self.out = run, Path(out)
        cmd = [sys.executable, "-m", "kinesis_source.tools.demo_driver", "--run", run,
               "--out", str(out), "--checkpoint", str(checkpoint),
               "--block-at-rows", str(block_at_rows)]
        for key, value in options.items():
            cmd += ["--option", f"{key}={value}"]
        self._log = open(self.out / f"{run}.log", "wb")
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def started(self) -> bool:
        """True once the query is running."""
        return (self.out / f"{self.run}.started").exists()

    def block(self) -> None:
        """Make the next batch with rows block after it is written."""
        (self.out / f"{self.run}.block").write_text("")

    def blocked_batch(self) -> int | None:
        """The batch the sink is blocked in, if it is."""
        marker = self.out / f"{self.run}.blocked"
        return int(marker.read_text()) if marker.exists() else None

    def status(self) -> dict:
        """The sink's totals so far (batches, rows, per_shard, source report)."""
        path = self.out / f"{self.run}.status.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def failed(self) -> str | None:
        """The tail of the driver's log if it exited by itself."""
        if self.proc.poll() is None:
            return None
        return (self.out / f"{self.run}.log").read_bytes()[-3000:].decode(errors="replace")

    def kill(self) -> None:
        """SIGKILL the driver and everything it started."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)
        self._log.close()

    def rows(self, batch_id: int | None = None) -> list[Row]:
        """Rows written by this run (one batch, or all), batch by batch."""
        import pyarrow.parquet as pq

        pattern = f"{self.run}-{batch_id}.parquet" if batch_id is not None else f"{self.run}-*.parquet"
        paths = sorted(self.out.glob(pattern), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
        out: list[Row] = []
        for path in paths:
            if not (path / "_SUCCESS").exists():
                continue  # a write the kill interrupted
            table = pq.read_table(path)
            out += list(zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True))
        return out


def main(argv: list[str] | None = None) -> None:
    """Run the query until killed."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--option", action="append", default=[], help="key=value")
    parser.add_argument("--block-at-rows", type=int, default=0,
                        help="block in the batch that brings the rows written to this many")
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from kinesis_source import register

    spark = (
        SparkSession.builder.master("local[2]")
        .appName(f"kinesis-ddb-{args.run}")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    out = Path(args.out)
    status: dict[str, Any] = {"batches": 0, "rows": 0, "per_shard": Counter(), "source": None}
    never = threading.Event()

    def sink(df, batch_id):
        counts = {r["shardId"]: r["count"] for r in df.groupBy("shardId").count().collect()}
        if not counts:
            return
        df.select("shardId", "sequenceNumber", "subSequenceNumber", "data").write.parquet(
            str(out / f"{args.run}-{batch_id}.parquet")
        )
        status["batches"] += 1
        status["rows"] += sum(counts.values())
        status["per_shard"].update(counts)
        progress = query.lastProgress
        if progress:
            report = progress["sources"][0]["latestOffset"]
            status["source"] = json.loads(report) if isinstance(report, str) else report
        tmp = out / f".{args.run}.status.tmp"
        tmp.write_text(json.dumps(status, default=dict))
        tmp.replace(out / f"{args.run}.status.json")
        crossed = 0 < args.block_at_rows <= status["rows"]
        if crossed or (out / f"{args.run}.block").exists():
            (out / f"{args.run}.blocked").write_text(str(batch_id))
            never.wait()

    reader = spark.readStream.format("kinesis-ddb")
    for pair in args.option:
        key, _, value = pair.partition("=")
        reader = reader.option(key, value)
    query = (
        reader.load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime="250 milliseconds")
        .start()
    )
    (out / f"{args.run}.started").write_text("")
    query.awaitTermination()


if __name__ == "__main__":
    main()
