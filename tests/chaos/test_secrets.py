"""Scenario 8: with static keys and a session token configured, the secret key and the token
appear in no log, offset, checkpoint file, progress JSON, DynamoDB item, repr or error message."""

from __future__ import annotations

import json
import uuid
import zlib
from pathlib import Path

import pytest

from kinesis_source.aws.clients import AwsSettings
from kinesis_source.errors import OptionError
from kinesis_source.executor import RangePartition
from kinesis_source.options import SourceOptions
from kinesis_source.positions import Position, ShardRange
from kinesis_source.source import KinesisDataSource, KinesisStreamReader
from tests.chaos import harness
from tests.chaos.driver import ChaosDriver
from tests.support.checker import load_deliveries
from tests.support.producer import Producer
from tests.support.spark_query import failure_of
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.backends("moto")]


def secrets():
    # moto accepts any credentials; these are unique so a hit cannot be a coincidence
    return f"chaosSecret{uuid.uuid4().hex}", f"chaosToken{uuid.uuid4().hex}"


def files_containing(root: Path, needles: list[str]) -> list[str]:
    """Files under ``root`` whose bytes contain any needle (names only: never the secret)."""
    hits = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if any(n.encode() in data for n in needles):
            hits.append(str(path.relative_to(root)))
    return hits


def test_secrets_appear_nowhere(ddb, kinesis, make_stream, source_options, tmp_path):
    secret, token = secrets()
    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    producer.put(100)
    options = {**source_options, "streamName": stream, "awsAccessKeyId": "AKIACHAOSVISIBLE",
               "awsSecretKey": secret, "awsSessionToken": token}
    app = options["applicationName"]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (tmp_path / "events").mkdir()
    # INFO logs everywhere (Spark and the source's Python loggers), Spark's event log, the plan
    driver = ChaosDriver("sec", run_dir, run_dir / "ck", options, log_level="INFO",
                         event_log=tmp_path / "events", env={"KDDB_CHAOS_PY_LOG": "INFO"})
    try:
        progress = run_dir / "sec.progress.jsonl"

        def rows():
            driver.check_alive()
            return sum(len(d.rows) for d in load_deliveries(run_dir / "deliveries", ["sec"]))

        wait_for(lambda: rows() >= 100, timeout=300, what="100 rows through the query")
        producer.put(50)
        wait_for(lambda: rows() >= 150 and progress.exists() and
                 sum(json.loads(x)["numInputRows"] for x in progress.read_text().splitlines()) >= 150,
                 timeout=300, what="150 rows, in the progress JSON too")
        wait_for(lambda: "== Physical Plan ==" in driver.log_path.read_text(errors="replace"), timeout=120,
                 what="the plan in the log")
    finally:
        driver.kill()
    # the things grepped are there and hold the options (else a clean grep proves nothing)
    log = driver.log_path.read_text(errors="replace")
    assert "INFO" in log and "kinesis_source" in log, "the driver log has none of the source's INFO lines"
    offsets = sorted((run_dir / "ck" / "offsets").glob("[0-9]*"))
    assert offsets and any(f"{stream}/shardId-" in p.read_text() for p in offsets)
    events = "".join(p.read_text(errors="replace") for p in (tmp_path / "events").rglob("*") if p.is_file())
    assert "SparkListenerSQLExecutionStart" in events and "kinesis-ddb-chaos" in events, \
        "the event log holds no query: grepping it proves nothing"
    leaks = files_containing(tmp_path, [secret, token])
    assert leaks == [], f"the secret or the token is written in {leaks}"
    items = ddb.query(TableName="kinesis_ddb_checkpoints", KeyConditionExpression="app = :a",
                      ExpressionAttributeValues={":a": {"S": app}})["Items"]
    # format 4 deflates its log entries and buckets: searched as they read, not as stored
    stored = json.dumps(items, default=lambda b: zlib.decompress(bytes(b)).decode())
    assert items and '"packed"' in stored and secret not in stored and token not in stored

    # reprs and strs of everything that holds them
    opts = SourceOptions.parse(options)
    settings = AwsSettings.for_kinesis(opts)
    rng = ShardRange(stream, "shardId-000000000000", Position.trim_horizon(), "5")
    shown = [repr(opts), str(opts), repr(settings), str(settings), repr(AwsSettings.for_dynamodb(opts)),
             repr(KinesisStreamReader(opts)), repr(RangePartition.of(rng, settings, opts)),
             repr(KinesisDataSource(options))]
    assert not any(secret in s or token in s for s in shown), "a repr shows the secret or the token"
    assert settings.secret_key == secret  # (they are held, just not shown)
    harness.publish("secrets", files_grepped=sum(1 for p in tmp_path.rglob("*") if p.is_file()),
                    reprs=len(shown), leaks=0)


def test_secrets_appear_in_no_error_message(spark, make_stream, source_options, tmp_path):
    secret, token = secrets()
    base = {**source_options, "awsAccessKeyId": "AKIACHAOSVISIBLE", "awsSecretKey": secret,
            "awsSessionToken": token, "maxRetries": "2"}
    messages = []
    # a query that fails at run time (a missing stream) with the secrets configured
    messages.append(failure_of(spark, {**base, "streamName": f"missing-{uuid.uuid4().hex[:6]}"}, tmp_path / "ck1"))
    # option errors around the secret options
    for bad in ({"awsSessionToken": token, "awsAccessKeyId": None, "awsSecretKey": None},
                {"awsSecretKey": secret, "awsAccessKeyId": None},
                {"roleExternalId": secret},
                {"awsSecretKey": secret, "profile": "p"},
                {"maxRetries": "many"}):
        opts = {k: v for k, v in {**base, "streamName": "s", **bad}.items() if v is not None}
        with pytest.raises(OptionError) as err:
            SourceOptions.parse(opts)
        messages.append(str(err.value))
        from pyspark.errors import PySparkException

        reader = spark.readStream.format("kinesis-ddb")
        for k, v in opts.items():
            reader = reader.option(k, v)
        with pytest.raises(PySparkException) as err2:
            reader.load()
        messages.append(str(err2.value))
    assert all(m for m in messages)
    assert not any(secret in m or token in m for m in messages), "an error message shows the secret or token"
