"""DynamoDB checkpoints with real Spark: resume without a Spark checkpoint, fencing, callbacks,
the CLI round trip, and bad checkpoint settings. moto server over HTTP for both services."""

from __future__ import annotations

import itertools
import json
import os
import uuid
from collections import Counter
from pathlib import Path

import pytest

from kinesis_source import register
from kinesis_source.positions import seq_key
from kinesis_source.tools.demo_driver import DriverProcess
from tests.support import callbacks
from tests.support.cli import cli
from tests.support.committed import TABLE, stored, wait_committed
from tests.support.producer import Producer
from tests.support.regression import RegressionWatch
from tests.support.spark_query import (
    Collector,
    failure_of,
    running,
    source_report,
    start_query,
    stop_quietly,
)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.spark



def keys_of(rows):
    return [(r.shard_id, r.seq) for r in rows]


def test_driver_killed_mid_batch_resumes_from_dynamodb_with_a_new_checkpoint(
    kinesis, make_stream, source_options, tmp_path
):
    stream = make_stream(4)
    producer = Producer(kinesis, stream)
    producer.put(400)
    out = tmp_path / "out"
    out.mkdir()
    options = {**source_options, "streamName": stream}
    first = DriverProcess("run1", out, tmp_path / "ck1", options)
    try:
        wait_for(lambda: len(first.rows()) >= 400, timeout=180, what="run1's first batch")
        first.block()
        producer.put(300)
        # (the batch that wrote the first 400 rows may itself be the one that blocks: id 0)
        wait_for(lambda: first.blocked_batch() is not None, timeout=120, what="a blocked batch")
        batch = first.blocked_batch()
        in_flight = set(first.rows(batch))
    finally:
        first.kill()  # SIGKILL while the batch is in flight
    assert in_flight
    producer.put(200)
    second = DriverProcess("run2", out, tmp_path / "ck2", options)  # a NEW Spark checkpoint
    want = {(p.shard_id, p.seq, 0, p.data) for p in producer.sent}
    # The batch in flight was written but never committed: its records count only when the
    # resumed run reads them again from the position committed in DynamoDB.
    committed = set(first.rows()) - in_flight
    try:
        wait_for(
            lambda: want <= committed | set(second.rows()),
            timeout=180,
            what="every record after the restart",
        )
    finally:
        second.kill()
    counts = Counter(first.rows() + second.rows())
    assert set(counts) == want, "records invented"
    duplicated = {row for row, n in counts.items() if n > 1}
    assert all(n <= 2 for n in counts.values())
    assert duplicated <= in_flight, "re-read more than the batch in flight"
    assert len(duplicated) <= len(in_flight)


def test_graceful_stop_then_new_checkpoint_reads_nothing_twice(
    spark, kinesis, ddb, make_stream, source_options, tmp_path
):
    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    producer.put(200)
    options = {**source_options, "streamName": stream}
    app = options["applicationName"]
    with running(spark, options, tmp_path / "ck1") as (_, first):
        wait_for(lambda: first.count() >= 200, timeout=90, what="200 rows")
        producer.put(100)
        wait_for(lambda: first.count() >= 300, timeout=90, what="300 rows")
        # The eager commit writes the last batch's end on the next (idle) trigger, before any
        # later batch exists to trigger commit().
        wait_committed(ddb, app, stream, producer.sent)
    producer.put(50)
    with running(spark, options, tmp_path / "ck2") as (_, second):  # a new checkpoint location
        wait_for(lambda: second.count() >= 50, timeout=90, what="the 50 new rows")
    rows = keys_of(first.rows()) + keys_of(second.rows())
    assert len(rows) == len(set(rows)) == 350


def test_same_spark_checkpoint_wins_over_dynamodb_behind_it(
    spark, kinesis, ddb, make_stream, source_options, tmp_path
):
    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    producer.put(200)
    options = {**source_options, "streamName": stream}
    app = options["applicationName"]
    ck = tmp_path / "ck"
    with running(spark, options, ck) as (_, first):
        wait_for(lambda: first.count() >= 200, timeout=90, what="200 rows")
        wait_committed(ddb, app, stream, producer.sent)
    # DynamoDB falls behind Spark's checkpoint: the application is reset to TRIM_HORIZON.
    cli("checkpoints", "reset", "--app", app, "--to", "TRIM_HORIZON", "--yes",
        "--endpoint-url", options["dynamodbEndpointUrl"], "--region", "us-east-1")
    assert stored(ddb, app) == {}
    producer.put(100)
    with running(spark, options, ck) as (_, second):  # the same Spark checkpoint
        wait_for(lambda: second.count() >= 100, timeout=90, what="the 100 new rows")
        wait_committed(ddb, app, stream, producer.sent)
    rows = keys_of(first.rows()) + keys_of(second.rows())
    assert sorted(rows) == sorted((p.shard_id, p.seq) for p in producer.sent)


def test_second_query_with_the_same_application_fences_the_first(
    spark, kinesis, ddb, make_stream, source_options, tmp_path
):
    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    producer.put(100)
    options = {**source_options, "streamName": stream}
    app = options["applicationName"]
    one, two = Collector(), Collector()
    q1 = start_query(spark, options, tmp_path / "ck1", one)
    q2 = None
    watch = RegressionWatch(ddb, app)
    try:
        wait_for(lambda: one.count() >= 100, timeout=90, what="q1 to read the backlog")
        wait_committed(ddb, app, stream, producer.sent)
        q2 = start_query(spark, options, tmp_path / "ck2", two)
        wait_for(lambda: q2.lastProgress is not None, timeout=90, what="q2 to claim")
        producer.put(100)
        wait_for(lambda: not q1.isActive, timeout=90, what="q1 to be fenced")
        wait_for(lambda: two.count() >= 100, timeout=90, what="q2 to read the new records")
        wait_committed(ddb, app, stream, producer.sent)
        message = str(q1.exception())
        assert q2.isActive
    finally:
        watch.stop()
        stop_quietly(q1)
        if q2 is not None:
            stop_quietly(q2)
    assert "was claimed by another query" in message
    assert f"application '{app}'" in message and TABLE in message
    assert watch.observations > 5 and watch.regressions == []
    # q1 stopped before reading the new records; q2 read each once
    assert sorted(keys_of(two.rows())) == sorted((p.shard_id, p.seq) for p in producer.sent[100:])
    assert not set(keys_of(one.rows())) & set(keys_of(two.rows()))


def test_commit_callbacks_both_ways_once_per_commit(
    spark, kinesis, ddb, make_stream, source_options, tmp_path
):
    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    fn_log = tmp_path / "fn.jsonl"

    def on_commit(info):  # runs in Spark's helper process, pickled with the source class
        line = {
            "epoch": info.epoch,
            "positions": {f"{s}/{sh}": seq for (s, sh), seq in sorted(info.positions.items())},
            "ended": sorted(f"{s}/{sh}" for s, sh in info.ended),
        }
        with open(fn_log, "a") as fh:
            fh.write(json.dumps(line, sort_keys=True) + "\n")

    options = {**source_options, "streamName": stream, "onCommit": "tests.support.callbacks:record"}
    app = options["applicationName"]
    register(spark, on_commit=on_commit)
    sink = Collector()
    query = start_query(spark, options, tmp_path / "ck", sink)
    try:
        for total in (100, 200, 300):
            producer.put(100)
            wait_for(lambda total=total: sink.count() >= total, timeout=90, what=f"{total} rows")
            wait_committed(ddb, app, stream, producer.sent)
        # No more data: the source's commit counter (in progress events) settles at the number
        # of DynamoDB commits, which must equal the number of callback invocations. The last
        # callback must have seen what DynamoDB holds: it runs just after the write, so until
        # then the counter of an earlier progress event can match the lines written so far.
        final = {str(k): p.seq for k, p in stored(ddb, app).items()}

        def settled():
            lines = fn_log.read_text().splitlines()
            return (
                lines
                and json.loads(lines[-1])["positions"] == final
                and query.lastProgress
                and source_report(query.lastProgress).get("ddbCommitCalls") == len(lines)
                and len(lines)
            )

        calls = wait_for(settled, timeout=30, what="the commit counter to match the callback count")
    finally:
        stop_quietly(query)
        register(spark)
    by_fn = [json.loads(x) for x in fn_log.read_text().splitlines()]
    by_option = [
        json.loads(x)
        for x in (Path(os.environ["KDDB_TEST_CALLBACK_DIR"]) / f"{app}.jsonl").read_text().splitlines()
    ]
    assert by_fn == by_option, "the two callbacks saw different commits"
    assert len(by_fn) == calls >= 3, "one callback per DynamoDB commit"
    assert by_fn[-1]["positions"] == final
    for before, after in itertools.pairwise(by_fn):
        for key, seq in before["positions"].items():
            assert seq_key(after["positions"][key]) >= seq_key(seq)
        assert after != before


def test_raising_callback_fails_the_query_with_its_message(
    spark, kinesis, make_stream, source_options, tmp_path
):
    stream = make_stream(1)
    Producer(kinesis, stream).put(20)
    options = {**source_options, "streamName": stream, "onCommit": "tests.support.callbacks:explode"}
    message = failure_of(spark, options, tmp_path / "ck")
    assert "Commit callback explode raised ValueError: callback refuses epoch" in message
    assert "onCommitErrors=log" in message


def test_raising_callback_with_errors_logged_goes_on(
    spark, kinesis, make_stream, source_options, tmp_path
):
    """The raising callback ran for every commit, each raise was logged with its traceback,
    and the query went on. Mutant caught: the callbacks not called at all (or the error not
    logged) with onCommitErrors=log; the query alone went on either way."""
    stream = make_stream(1)
    producer = Producer(kinesis, stream)
    producer.put(20)
    app = source_options["applicationName"]
    options = {
        **source_options,
        "streamName": stream,
        "onCommit": "tests.support.callbacks:record_then_explode",
        "onCommitErrors": "log",
    }
    runs = Path(os.environ["KDDB_TEST_CALLBACK_DIR"]) / f"{app}.jsonl"
    logged = Path(callbacks.log_path(app))

    def calls_and_logs():
        ran = runs.read_text().splitlines() if runs.exists() else []
        text = logged.read_text() if logged.exists() else ""
        return len(ran), text.count(
            "ERROR kinesis_source.checkpoints.callbacks: commit callback record_then_explode raised; "
            "going on (onCommitErrors=log)"
        ), text

    with running(spark, options, tmp_path / "ck") as (query, sink):
        wait_for(lambda: sink.count() >= 20, timeout=90, what="20 rows")
        wait_for(lambda: calls_and_logs()[0] >= 1, timeout=60, what="the callback to run")
        producer.put(20)
        wait_for(lambda: sink.count() >= 40, timeout=90, what="40 rows after a failed callback")
        wait_for(lambda: calls_and_logs()[0] >= 2, timeout=60, what="the callback to run again")
        assert query.isActive
        ran, logs, text = wait_for(
            lambda: (lambda c: c if c[0] == c[1] else None)(calls_and_logs()),
            timeout=30, what="a log entry for each raise",
        )
    assert ran >= 2 and logs == ran
    assert "ValueError: callback refuses epoch" in text  # the traceback is in the log


def test_cli_show_export_reset_round_trip(
    spark, kinesis, ddb, make_stream, source_options, tmp_path
):
    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    producer.put(100)
    options = {**source_options, "streamName": stream}
    app = options["applicationName"]
    where = ["--app", app, "--endpoint-url", options["dynamodbEndpointUrl"], "--region", "us-east-1"]
    with running(spark, options, tmp_path / "ck1") as (_, first):
        wait_for(lambda: first.count() >= 100, timeout=90, what="100 rows")
        wait_committed(ddb, app, stream, producer.sent)
    committed = stored(ddb, app)

    shown = cli("checkpoints", "show", *where).stdout
    for key, pos in committed.items():
        assert str(key) in shown and pos.to_str() in shown
    assert "epoch" in shown

    exported = tmp_path / "positions.json"
    cli("checkpoints", "export", *where, "-o", str(exported))
    assert json.loads(exported.read_text()) == {str(k): p.to_str() for k, p in committed.items()}

    refused = cli("checkpoints", "reset", *where, "--to", "TRIM_HORIZON", check=False)
    assert refused.returncode == 2 and "without --yes" in refused.stderr
    assert stored(ddb, app) == committed

    cli("checkpoints", "reset", *where, "--to", "TRIM_HORIZON", "--yes")
    assert stored(ddb, app) == {}
    cli("checkpoints", "reset", *where, "--to-file", str(exported), "--yes")

    producer.put(50)
    with running(spark, options, tmp_path / "ck2") as (_, second):
        wait_for(lambda: second.count() >= 50, timeout=90, what="the 50 new rows")
        wait_committed(ddb, app, stream, producer.sent)
    assert sorted(keys_of(second.rows())) == sorted((p.shard_id, p.seq) for p in producer.sent[100:])


def test_missing_table_with_create_false_fails_naming_it(
    spark, kinesis, make_stream, source_options, tmp_path
):
    stream = make_stream(1)
    table = f"absent-{uuid.uuid4().hex[:6]}"
    options = {**source_options, "streamName": stream, "checkpointTable": table, "createTable": "false"}
    message = failure_of(spark, options, tmp_path / "ck")
    assert f"DynamoDB checkpoint table '{table}' does not exist" in message
    assert "createTable" in message


def test_table_with_wrong_key_schema_fails_naming_it(
    spark, kinesis, ddb, make_stream, source_options, tmp_path
):
    stream = make_stream(1)
    table = f"wrong-{uuid.uuid4().hex[:6]}"
    ddb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    options = {**source_options, "streamName": stream, "checkpointTable": table}
    message = failure_of(spark, options, tmp_path / "ck")
    assert f"DynamoDB table '{table}' has key schema" in message
    assert "partition key 'app' (S) and sort key 'key' (S)" in message


def test_missing_application_name_fails_at_load(spark, source_options):
    from pyspark.errors import PySparkException

    options = {k: v for k, v in source_options.items() if k != "applicationName"}
    with pytest.raises(PySparkException) as err:
        spark.readStream.format("kinesis-ddb").options(**options).option("streamName", "s").load()
    assert "Option 'applicationName' is required" in str(err.value)


def test_recreated_stream_is_detected(
    spark, kinesis, ddb, make_stream, source_options, tmp_path
):
    stream = make_stream(1)
    Producer(kinesis, stream).put(10)
    options = {**source_options, "streamName": stream}
    with running(spark, options, tmp_path / "ck1") as (_, sink):
        wait_for(lambda: sink.count() >= 10, timeout=90, what="10 rows")
    kinesis.delete_stream(StreamName=stream)
    wait_for(lambda: stream not in kinesis.list_streams()["StreamNames"], timeout=30, what="deletion")
    kinesis.create_stream(StreamName=stream, ShardCount=1)
    message = failure_of(spark, options, tmp_path / "ck2")
    assert f"Kinesis stream '{stream}' was deleted and re-created" in message
    assert "checkpoints reset" in message
    # as the message says: reset the application, and it reads the new stream
    cli("checkpoints", "reset", "--app", options["applicationName"], "--to", "TRIM_HORIZON",
        "--yes", "--endpoint-url", options["dynamodbEndpointUrl"], "--region", "us-east-1")
    fresh = Producer(kinesis, stream, tag="new").put(15)
    with running(spark, options, tmp_path / "ck3") as (_, sink):
        wait_for(lambda: sink.count() >= 15, timeout=90, what="the new stream's records")
    assert sorted(r.data for r in sink.rows()) == sorted(p.data for p in fresh)
