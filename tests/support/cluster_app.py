"""The driver the cluster tests run on the cluster's driver host, in client mode against the
standalone master: it reads a stream with ``format("kinesis-ddb")`` into a ``foreachBatch``
sink until it holds ``--expect`` rows (or ``--timeout`` passes), then prints one JSON line: the
rows (shard, sequence number, data) and the source's last progress report (tip reports
delivered, ranges carried, ...), and which executor hosts ran tasks.

    python -m tests.support.cluster_app --master spark://H:7077 --driver-host A --expect N
        --checkpoint DIR --option key=value ...
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--master", required=True)
    parser.add_argument("--driver-host", required=True)
    parser.add_argument("--expect", type=int, required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--timeout", type=float, default=240)
    parser.add_argument("--option", action="append", default=[])
    parser.add_argument("--produce", type=int, default=0,
                        help="rounds of 50 records put while the query runs, one every 0.5 s")
    args = parser.parse_args()
    options = dict(pair.partition("=")[::2] for pair in args.option)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(args.master).appName("kinesis-ddb-cluster")
             .config("spark.driver.host", args.driver_host).config("spark.driver.bindAddress", args.driver_host)
             .config("spark.executor.cores", "1").config("spark.cores.max", "2")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    from kinesis_source import register

    register(spark)
    rows: list[tuple[str, str, str]] = []
    hosts: set[str] = set()
    lock = threading.Lock()

    def sink(df, batch_id):
        got = df.select("shardId", "sequenceNumber", "data").collect()
        with lock:
            rows.extend((r[0], r[1], bytes(r[2]).decode()) for r in got)

    reader = spark.readStream.format("kinesis-ddb")
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (reader.load().writeStream.foreachBatch(sink)
             .option("checkpointLocation", args.checkpoint).trigger(processingTime="500 milliseconds").start())
    sent: list[tuple[str, str]] = []
    producer = threading.Thread(target=produce, args=(options, args.produce, sent), daemon=True)
    producer.start()
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline and query.isActive:
        with lock:
            if len(rows) >= args.expect + 50 * args.produce:
                break
        query.awaitTermination(0.5)
    error = str(query.exception()) if not query.isActive and query.exception() else None
    # the newest progress that has the source's report (a trigger that found nothing has none)
    reports = [(p.get("sources") or [{}])[0].get("latestOffset") for p in query.recentProgress]
    report = next((r for r in reversed(reports) if r), "{}")
    source = json.loads(report) if isinstance(report, str) else report
    # where tasks ran: each executor's host as Spark's status tracker knows it (the driver too)
    for info in spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos():  # noqa: SLF001
        hosts.add(info.host())
    query.stop()
    producer.join(timeout=60)
    print(json.dumps({"rows": rows, "sent": sent, "metrics": source, "executor_hosts": sorted(hosts),
                      "driver": socket.gethostname(), "error": error}), flush=True)
    spark.stop()


def produce(options: dict[str, str], rounds: int, sent: list[tuple[str, str]]) -> None:
    """``rounds`` of 50 records put to the query's stream, one every 0.5 s (what each got in
    ``sent``)."""
    import boto3

    kinesis = boto3.client("kinesis", endpoint_url=options["endpointUrl"], region_name=options["region"],
                           aws_access_key_id=options["awsAccessKeyId"], aws_secret_access_key=options["awsSecretKey"])
    for n in range(rounds):
        time.sleep(0.5)  # the producer's pace, not a wait for anything
        resp = kinesis.put_records(StreamName=options["streamName"], Records=[
            {"Data": f"live-{n}-{i}".encode(), "PartitionKey": f"k{i}"} for i in range(50)])
        sent.extend((r["ShardId"], r["SequenceNumber"]) for r in resp["Records"])


if __name__ == "__main__":
    main()
