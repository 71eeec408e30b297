"""The driver the cluster tests run on the cluster's driver host, in client mode against the
standalone master.

It reads a stream with ``format("kinesis-ddb")`` into a ``foreachBatch`` sink until it holds
``--expect`` distinct records and every record it put itself (``--produce`` rounds), or
``--timeout`` passes. Then it prints one JSON line: the rows (shard, sequence number, data,
batch id), the source's progress reports (tip reports delivered, ranges carried, ...), and
which executor hosts ran tasks. While it runs it prints ``BATCH <id> <distinct records>`` after
each batch, which a test watches to inject a fault mid-run; a test that puts more records
meanwhile says so with ``MORE <n>`` lines on stdin, and ``END`` when it puts no more (the run
ends only after it).

With ``--sink-stream`` it copies the stream into that one with the ``kinesis-ddb`` sink under
``Trigger.AvailableNow`` instead, and prints the JSON line when the query ends.

    python -m tests.support.cluster_app --master spark://H:7077 --driver-host A --expect N
        --checkpoint DIR --option key=value ... [--conf key=value ...]
"""

from __future__ import annotations

import argparse
import itertools
import json
import socket
import sys
import threading
import time

ROUND = 50  # records per producer round
MAX_EXTRA_ROUNDS = 240  # --until-reports: rounds put past --produce at most


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--master", required=True)
    parser.add_argument("--driver-host", required=True)
    parser.add_argument("--expect", type=int, required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--timeout", type=float, default=240)
    parser.add_argument("--option", action="append", default=[])
    parser.add_argument("--conf", action="append", default=[], help="Spark configuration key=value")
    parser.add_argument("--produce", type=int, default=0,
                        help=f"rounds of {ROUND} records put while the query runs, one every 0.5 s")
    parser.add_argument("--until-reports", action="store_true",
                        help="keep producing (and reading) until a progress report counts a tip report")
    parser.add_argument("--tag", default="live", help="the producer's records are <tag>-<round>-<key>")
    parser.add_argument("--count", help="comma-separated data prefixes: only such records count "
                        "toward --expect (a resumed run may read an earlier run's records again)")
    parser.add_argument("--slow-ms", type=float, default=0,
                        help="a Python UDF that takes this long per row (tasks that run for a while)")
    parser.add_argument("--sink-stream", help="copy the stream into this one with the kinesis-ddb sink")
    args = parser.parse_args()
    options = dict(pair.partition("=")[::2] for pair in args.option)
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(args.master).appName("kinesis-ddb-cluster")
               .config("spark.driver.host", args.driver_host).config("spark.driver.bindAddress", args.driver_host)
               .config("spark.executor.cores", "1").config("spark.cores.max", "2")
               .config("spark.sql.shuffle.partitions", "2"))
    for pair in args.conf:
        builder = builder.config(*pair.split("=", 1))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    from kinesis_source import register

    register(spark)
    reader = spark.readStream.format("kinesis-ddb")
    for key, value in options.items():
        reader = reader.option(key, value)
    if args.sink_stream:
        out = copy(reader.load(), options, args)
    else:
        out = read(reader.load(), options, args)
    for info in spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos():  # noqa: SLF001
        out["executor_hosts"].append(info.host())
    out["failed_tasks"] = failed_tasks(spark)
    out["task_attempts_failed"] = attempts_failed(spark)
    out["driver"] = socket.gethostname()
    print(json.dumps(out), flush=True)
    spark.stop()


def read(df, options: dict[str, str], args: argparse.Namespace) -> dict:
    """The reader run: ``foreachBatch`` collects every row."""
    rows: list[tuple[str, str, str, int]] = []
    seen: set[tuple[str, str]] = set()
    lock = threading.Lock()

    counted = tuple(args.count.split(",")) if args.count else ("",)

    def sink(batch, batch_id):
        got = [(r[0], r[1], bytes(r[2]).decode()) for r in batch.select("shardId", "sequenceNumber", "data").collect()]
        with lock:
            rows.extend((*r, batch_id) for r in got)
            seen.update((shard, seq) for shard, seq, data in got if data.startswith(counted))
            print(f"BATCH {batch_id} {len(seen)}", flush=True)

    if args.slow_ms:
        from pyspark.sql.functions import udf

        pause = args.slow_ms / 1000

        @udf("binary")
        def slow(data):
            time.sleep(pause)  # the work a user's transformation does per row
            return data

        df = df.withColumn("data", slow("data"))
    query = (df.writeStream.foreachBatch(sink).option("checkpointLocation", args.checkpoint)
             .trigger(processingTime="500 milliseconds").start())
    sent: list[tuple[str, str]] = []
    reported = threading.Event()
    producing = threading.Event()
    producing.set()
    producer = threading.Thread(target=produce, args=(options, args, sent, reported, producing), daemon=True)
    producer.start()
    expect = [args.expect]
    told_all = threading.Event()
    threading.Thread(target=more_expected, args=(expect, told_all), daemon=True).start()
    deadline = time.monotonic() + args.timeout
    done = False
    while time.monotonic() < deadline and query.isActive:
        if args.until_reports and any(r.get("tipReports", 0) > 0 for r in _reports(query)):
            reported.set()
        with lock:
            if told_all.is_set() and not producing.is_set() and len(seen) >= expect[0] + len(sent):
                done = True
                break
        query.awaitTermination(0.5)
    error = str(query.exception()) if not query.isActive and query.exception() else None
    if error is None and not done:
        error = f"timed out after {args.timeout:.0f} s with {len(seen)} of {expect[0] + len(sent)} records"
    reports = _reports(query)
    query.stop()
    producing.clear()
    producer.join(timeout=60)
    return {"rows": rows, "sent": sent, "metrics": reports[-1] if reports else {}, "reports": reports,
            "executor_hosts": [], "error": error}


def copy(df, options: dict[str, str], args: argparse.Namespace) -> dict:
    """The sink run: the stream copied into ``--sink-stream`` under ``Trigger.AvailableNow``."""
    sink = {k: options[k] for k in ("endpointUrl", "region", "awsAccessKeyId", "awsSecretKey")}
    query = (df.selectExpr("data", "partitionKey").writeStream.format("kinesis-ddb")
             .options(**sink, streamName=args.sink_stream).option("checkpointLocation", args.checkpoint)
             .trigger(availableNow=True).start())
    done = query.awaitTermination(args.timeout)
    error = str(query.exception()) if query.exception() else (None if done else "timed out")
    reports = _reports(query)
    query.stop()
    return {"rows": [], "sent": [], "metrics": reports[-1] if reports else {}, "reports": reports,
            "executor_hosts": [], "error": error}


def more_expected(expect: list[int], told_all: threading.Event) -> None:
    """``MORE <n>`` lines on stdin: the test puts ``n`` more records the run must read; ``END``
    (or stdin closed): it puts no more, the run may end once it read them all."""
    for line in sys.stdin:
        if line.startswith("MORE "):
            expect[0] += int(line.split()[1])
        elif line.startswith("END"):
            break
    told_all.set()


def failed_tasks(spark) -> dict[str, int]:
    """Tasks that failed, by executor host (removed executors included), from Spark's UI API."""
    import urllib.request

    sc = spark.sparkContext
    url = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/allexecutors"
    with urllib.request.urlopen(url, timeout=30) as resp:
        executors = json.load(resp)
    out: dict[str, int] = {}
    for executor in executors:
        host = executor["hostPort"].rsplit(":", 1)[0]
        out[host] = out.get(host, 0) + executor["failedTasks"]
    return out


def attempts_failed(spark) -> dict[str, int]:
    """Task attempts that did not succeed, by the host they ran on, every stage's (the UI API's
    task lists: a task lost with its executor is retried without counting as its failure)."""
    import urllib.request

    sc = spark.sparkContext
    base = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/stages"
    out: dict[str, int] = {}
    with urllib.request.urlopen(base, timeout=30) as resp:
        stages = json.load(resp)
    for stage in stages:
        url = f"{base}/{stage['stageId']}/{stage['attemptId']}/taskList?length=10000"
        with urllib.request.urlopen(url, timeout=30) as resp:
            for task in json.load(resp):
                if task["status"] not in ("SUCCESS", "RUNNING"):
                    out[task["host"]] = out.get(task["host"], 0) + 1
    return out


def _reports(query) -> list[dict]:
    """The source's progress reports, oldest first (a trigger that found nothing has none)."""
    found = []
    for progress in query.recentProgress:
        report = (progress.get("sources") or [{}])[0].get("latestOffset")
        if report:
            found.append(json.loads(report) if isinstance(report, str) else report)
    return found


def put_round(kinesis, stream: str, tag: str, n: int, pad: int = 0) -> tuple[list[tuple[str, str, str]], int]:
    """Round ``n`` of ``ROUND`` records, ``<tag>-<n>-<key>`` then ``|`` and ``pad`` bytes, keys
    ``k0``..: those written (shard, sequence number, data), and how many were refused."""
    data = [f"{tag}-{n}-{i}|{'x' * pad}" for i in range(ROUND)]
    resp = kinesis.put_records(StreamName=stream, Records=[
        {"Data": d.encode(), "PartitionKey": f"k{i}"} for i, d in enumerate(data)])
    written = [(r["ShardId"], r["SequenceNumber"], d) for d, r in zip(data, resp["Records"], strict=True)
               if "SequenceNumber" in r]
    return written, ROUND - len(written)


def produce(options: dict[str, str], args: argparse.Namespace, sent: list[tuple[str, str]],
            reported: threading.Event, producing: threading.Event) -> None:
    """``--produce`` rounds put to the query's stream, one every 0.5 s (what each got in
    ``sent``); with ``--until-reports``, more until a report is counted. Clears ``producing``."""
    import boto3

    kinesis = boto3.client("kinesis", endpoint_url=options["endpointUrl"], region_name=options["region"],
                           aws_access_key_id=options["awsAccessKeyId"], aws_secret_access_key=options["awsSecretKey"])
    try:
        for n in itertools.count():
            done = n >= args.produce and (not args.until_reports or reported.is_set())
            if done or n >= args.produce + MAX_EXTRA_ROUNDS or not producing.is_set():
                return
            time.sleep(0.5)  # the producer's pace, not a wait for anything
            written, refused = put_round(kinesis, options["streamName"], args.tag, n)
            sent.extend((shard, seq) for shard, seq, _ in written)
            if refused:
                print(f"PRODUCER refused {refused}", file=sys.stderr)
    finally:
        producing.clear()


if __name__ == "__main__":
    main()
