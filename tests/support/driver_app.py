"""A Spark driver in its own process, for tests that kill it (SIGKILL) mid-batch.

Reads ``format("kinesis-ddb")`` into a file sink: each batch's rows go to
``<out>/<run>-<batchId>.jsonl`` (written to a temporary name, then renamed). With
``--block-after N`` the N-th batch with rows is written and then the sink blocks forever, with a
``<out>/<run>.blocked`` marker: the test kills the process while that batch is in flight.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--block-after", type=int, default=0)
    parser.add_argument("--option", action="append", default=[], help="key=value")
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from kinesis_source import register

    spark = (
        SparkSession.builder.master("local[2]")
        .appName(f"kinesis-ddb-driver-{args.run}")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    out = Path(args.out)
    with_rows = {"n": 0}
    never = threading.Event()

    def sink(df, batch_id):
        rows = [
            {"shard": r["shardId"], "seq": r["sequenceNumber"], "data": bytes(r["data"]).decode()}
            for r in df.collect()
        ]
        if not rows:
            return
        tmp = out / f".{args.run}-{batch_id}.tmp"
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tmp.rename(out / f"{args.run}-{batch_id}.jsonl")
        with_rows["n"] += 1
        if with_rows["n"] == args.block_after:
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
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    (out / f"{args.run}.started").write_text("")
    query.awaitTermination()


if __name__ == "__main__":
    main()
