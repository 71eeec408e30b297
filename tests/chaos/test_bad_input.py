"""Scenario 7: bad input. Every option with every kind of bad value, a missing stream, a missing
table, a table with the wrong schema, missing credentials, endpoints that refuse connections:
each fails with an error naming the thing, and none leaves positions in DynamoDB."""

from __future__ import annotations

import uuid

import pytest

from kinesis_source.errors import OptionError
from kinesis_source.options import SourceOptions, option_specs
from kinesis_source.tools.local import free_port
from tests.chaos import harness
from tests.chaos.driver import ChaosDriver
from tests.support.committed import TABLE
from tests.support.spark_query import failure_of, running
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.backends("moto")]

# option -> bad values (every kind the option can get wrong: empty, blank, wrong type, out of
# range, bad format); "" and "  " are added for every option below.
BAD_VALUES: dict[str, list[str]] = {
    "streamName": ["bad name!", "s" * 129, "a,a", "a,,b"],
    "streamARN": ["orders", "arn:aws:sqs:us-east-1:123456789012:queue", "arn:aws:kinesis:us-east-1:12:stream/x",
                  "arn:aws:kinesis:us-east-1:123456789012:stream/a,arn:aws:kinesis:eu-west-1:123456789012:stream/b",
                  "arn:aws:kinesis:us-east-1:123456789012:stream/a,arn:aws:kinesis:us-east-1:210987654321:stream/a"],
    "region": [],
    "endpointUrl": ["localhost:4566", "ftp://127.0.0.1", "http://"],
    "initialPosition": ["EARLIEST", "AT_TIMESTAMP:yesterday", "{not json", "[]", "{}",
                        '{"shardId-000000000000": 5}', '{"shardId-000000000000": "nonsense"}'],
    "maxRecordsPerFetch": ["abc", "1.5", "0", "-1", "10001"],
    "maxRecordsPerBatch": ["abc", "0", "-1", "2.5"],
    "shardsPerTask": ["abc", "0", "-3", "1.5"],
    "minProbeIntervalMs": ["abc", "-1", "1e3"],
    "maxIdleProbeIntervalMs": ["abc", "-1", "2.5"],
    "checkpointIntervalMs": ["abc", "-1", "0.5"],
    "getRecordsPerShardPerSecond": ["abc", "0", "-1", "5.5", "nan"],
    "getShardIteratorPerShardPerSecond": ["abc", "0", "6", "inf"],
    "maxReadRatePerShard": ["abc", "0", "-1", "3MiB", "1GB", "2 parsecs", "0.5 MiB per day"],
    "tipReports": ["maybe"],
    "tipReportHost": ["http://10.0.0.5", "10.0.0.5:7077", " "],
    "shardDiscoveryIntervalMs": ["abc", "-5", "0.5"],
    "onCorruptAggregate": ["ignore", "1"],
    "maxRetries": ["abc", "0", "101", "-3"],
    "applicationName": ["bad/name", "a" * 129, "with space"],
    "checkpointTable": ["ab", "bad name", "t" * 256, "tab/le"],
    "createTable": ["yes", "1", "maybe"],
    "dynamodbEndpointUrl": ["localhost:8000", "file:///tmp/x", "http://"],
    "dynamodbRegion": [],
    "onCommit": ["not a path", "module", "pkg.mod:", ":fn", "a.b:c d"],
    "credentialsProvider": ["not a path", "module", "pkg.mod:", ":fn"],
    "onCommitErrors": ["ignore", "raise"],
    "failOnDataLoss": ["no", "0"],
    "retryBaseDelayMs": ["abc", "0", "60001", "-1"],
    "awsAccessKeyId": [],
    "awsSecretKey": [],
    "awsSessionToken": [],
    "profile": [],
    "roleArn": ["arn:aws:iam::123:role/x", "role/reader", "arn:aws:s3:::bucket"],
    "roleSessionName": ["x", "bad name", "s" * 65],
    "roleExternalId": [],
    "stsEndpointUrl": ["sts.amazonaws.com", "tcp://127.0.0.1:1"],
    "consumerMode": ["fanout", "efo2"],
    "consumerName": ["bad/name", "c" * 129],
    "consumerTimeoutMs": ["abc", "999", "-1"],
    "subscribeTimeoutMs": ["abc", "4999", "-1", "1.5"],
    "deregisterConsumer": ["yes", "2"],
    "efoTipWatch": ["maybe", "2"],
    "efoSubscriptions": ["driver", "executor", "1"],
}
# options that only mean something next to another one: give the partner so the value itself is
# what is judged
PARTNERS = {
    "awsAccessKeyId": {"awsSecretKey": "k"},
    "awsSecretKey": {"awsAccessKeyId": "k"},
    "awsSessionToken": {"awsAccessKeyId": "k", "awsSecretKey": "k"},
    "roleSessionName": {"roleArn": "arn:aws:iam::123456789012:role/r"},
    "roleExternalId": {"roleArn": "arn:aws:iam::123456789012:role/r"},
    "stsEndpointUrl": {"roleArn": "arn:aws:iam::123456789012:role/r"},
    "consumerName": {"consumerMode": "efo"},
    "consumerTimeoutMs": {"consumerMode": "efo"},
    "subscribeTimeoutMs": {"consumerMode": "efo"},
    "deregisterConsumer": {"consumerMode": "efo"},
}
# options that stand in for another: the other is left out so the value itself is judged
INSTEAD_OF = {"streamARN": "streamName"}
SECRET_OPTIONS = {"awsSecretKey", "awsSessionToken", "roleExternalId"}
COMBINATIONS = [
    ({"awsAccessKeyId": "k"}, ["awsAccessKeyId", "awsSecretKey"]),
    ({"awsSecretKey": "k"}, ["awsAccessKeyId", "awsSecretKey"]),
    ({"awsSessionToken": "t"}, ["awsSessionToken", "awsAccessKeyId"]),
    ({"roleExternalId": "x"}, ["roleExternalId", "roleArn"]),
    ({"stsEndpointUrl": "http://127.0.0.1:1"}, ["stsEndpointUrl", "roleArn"]),
    ({"profile": "p", "awsAccessKeyId": "k", "awsSecretKey": "k"}, ["profile", "awsAccessKeyId"]),
    ({"credentialsProvider": "m:f", "profile": "p"}, ["credentialsProvider", "profile"]),
    ({"streamNmae": "x"}, ["streamNmae", "streamName"]),  # a misspelt option: did you mean
    ({"noSuchOption": "x"}, ["noSuchOption"]),
    ({"streamARN": "arn:aws:kinesis:us-east-1:123456789012:stream/a"}, ["streamName", "streamARN"]),
    ({"streamName": None, "streamARN": "arn:aws:kinesis:eu-west-1:123456789012:stream/a", "region": "us-east-1"},
     ["region", "streamARN"]),  # None: the base's option left out
]


def base_options(source_options):
    opts = {k: v for k, v in source_options.items() if k not in ("awsAccessKeyId", "awsSecretKey")}
    return {**opts, "streamName": "some-stream"}


def app_rows(ddb, app, table=TABLE):
    """Every item of the application (meta and shard positions)."""
    try:
        items = ddb.query(TableName=table, KeyConditionExpression="app = :a",
                          ExpressionAttributeValues={":a": {"S": app}}, ConsistentRead=True)["Items"]
    except ddb.exceptions.ResourceNotFoundException:
        return []
    return items


def shard_rows(ddb, app, table=TABLE):
    return [i for i in app_rows(ddb, app, table) if i["key"]["S"].startswith(("shard#", "shards#"))]


def load_error(spark, options) -> str:
    from pyspark.errors import PySparkException

    reader = spark.readStream.format("kinesis-ddb")
    for k, v in options.items():
        reader = reader.option(k, v)
    with pytest.raises(PySparkException) as err:
        reader.load()
    return str(err.value)


def parse_error(options) -> str:
    """The error ``load()`` raises, taken from the same validation without a Spark round trip
    (each ``load()`` costs a Python worker call; a sample goes through Spark below)."""
    with pytest.raises(OptionError) as err:
        SourceOptions.parse(options)
    return str(err.value)


def bad_cases(source_options):
    """(options, names the message must hold, value it must show or None, secret?)"""
    for key, values in BAD_VALUES.items():
        for value in ["", "   ", *values]:
            base = {k: v for k, v in base_options(source_options).items() if k != INSTEAD_OF.get(key)}
            options = {**base, **PARTNERS.get(key, {}), key: value}
            yield options, [key], (value if value.strip() else None), key in SECRET_OPTIONS
    for options, names in COMBINATIONS:
        merged = {**base_options(source_options), **options}
        yield {k: v for k, v in merged.items() if v is not None}, names, None, False
    for required in ("streamName", "applicationName"):
        yield {k: v for k, v in base_options(source_options).items() if k != required}, [required], None, False


def check_message(message, names, value, secret):
    for name in names:
        # Spark hands the source its option keys lower-cased; the source names its own options
        # as declared, an unknown key as Spark gave it
        assert f"'{name.lower()}'" in message.lower(), f"{name} not named in: {message[-600:]}"
    if secret:
        assert "<redacted>" in message, message[-600:]
    elif value is not None:
        assert repr(value) in message, f"{value!r} not shown in: {message[-600:]}"


def test_every_option_with_every_kind_of_bad_value(spark, ddb, source_options):
    specs = {s["key"] for s in option_specs()}
    assert set(BAD_VALUES) == specs, f"options without bad-value cases: {specs - set(BAD_VALUES)}"
    cases = list(bad_cases(source_options))
    for options, names, value, secret in cases:
        check_message(parse_error(options), names, value, secret)
    # the same errors reach the user through Spark's load(): one case of each kind
    sample = harness.rng_for("bad-options").sample(cases, 6) + [cases[-1], cases[-3]]
    for options, names, value, secret in sample:
        check_message(load_error(spark, options), names, value, secret)
    assert app_rows(ddb, source_options["applicationName"]) == []
    harness.publish("bad-options", cases=len(cases), through_spark=len(sample), options=len(specs),
                    partial_positions=0)


def runtime_case(spark, ddb, options, tmp_path, table=TABLE):
    app = options["applicationName"]
    message = failure_of(spark, options, tmp_path / f"ck-{uuid.uuid4().hex[:6]}")
    return message, shard_rows(ddb, app, table)


FAST_FAIL = {"maxRetries": "2", "retryBaseDelayMs": "50"}


# What a user reads first: Spark's prefix, its Python traceback, then our message. These cases
# run with the default retries, as users run, and the actionable words must come this early.
FIRST_LINES = 15


def actionable(message: str, words: str) -> None:
    """``words`` appear once in ``message``, within its first FIRST_LINES lines."""
    lines = message.splitlines()
    where = [n for n, line in enumerate(lines, start=1) if words in line]
    assert message.count(words) == 1, message
    assert where and where[0] <= FIRST_LINES, f"line {where} of {len(lines)}:\n{message}"


def failure_within(spark, options, checkpoint, timeout_s: float) -> str:
    """Start a query that must fail within ``timeout_s`` of its start; its error message."""
    with running(spark, options, checkpoint) as (query, _):
        wait_for(lambda: not query.isActive, timeout=timeout_s, what="the query to fail")
        return str(query.exception())


def test_missing_stream_names_it_on_top_and_claims_nothing(spark, ddb, kinesis, source_options, tmp_path):
    stream = f"missing-{uuid.uuid4().hex[:8]}"
    options = {**source_options, "streamName": stream}
    message = failure_within(spark, options, tmp_path / "ck", 60)
    actionable(message, f"Kinesis stream '{stream}' was not found: check option 'streamName'")
    # the stream is looked up before the application is claimed: no meta row, no positions
    assert app_rows(ddb, options["applicationName"]) == []


@pytest.mark.parametrize(("which", "words"), [
    ("endpointUrl", "Could not connect to Kinesis for stream '{stream}': check option 'endpointUrl'"),
    ("dynamodbEndpointUrl", "Could not connect to DynamoDB for application '{app}' in DynamoDB table "
                            "'{table}': check option 'dynamodbEndpointUrl'"),
])
def test_endpoint_refusing_connections_fails_within_seconds_naming_the_option(
    which, words, spark, ddb, make_stream, source_options, tmp_path
):
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    stream = make_stream(1)
    options = {**source_options, "streamName": stream, which: dead}
    message = failure_within(spark, options, tmp_path / "ck", 10)
    actionable(message, words.format(stream=stream, app=options["applicationName"], table=TABLE))
    assert dead in message
    assert app_rows(ddb, options["applicationName"]) == []


@pytest.mark.parametrize(("options", "words"), [
    ({"streamNmae": "x"},
     "Unknown option 'streamnmae' for reading with format kinesis-ddb; did you mean 'streamName'?"),
    ({"startingPosition": "LATEST"}, "here it is 'initialPosition'"),
    ({"applicationName": None}, "Option 'applicationName' is required"),
])
def test_load_mistakes_are_named_on_top(options, words, spark, source_options):
    merged = {**base_options(source_options), **options}
    actionable(load_error(spark, {k: v for k, v in merged.items() if v is not None}), words)


def test_missing_table_with_create_false_names_it_and_creates_nothing(
    spark, ddb, make_stream, source_options, tmp_path
):
    table = f"absent-{uuid.uuid4().hex[:6]}"
    options = {**source_options, **FAST_FAIL, "streamName": make_stream(1), "checkpointTable": table,
               "createTable": "false"}
    message, rows = runtime_case(spark, ddb, options, tmp_path, table)
    assert f"DynamoDB checkpoint table '{table}' does not exist" in message and "createTable" in message
    assert table not in ddb.list_tables()["TableNames"] and rows == []


def test_table_with_wrong_schema_names_it_and_writes_nothing(spark, ddb, make_stream, source_options, tmp_path):
    table = f"wrong-{uuid.uuid4().hex[:6]}"
    ddb.create_table(TableName=table, KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                     AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                     BillingMode="PAY_PER_REQUEST")
    options = {**source_options, **FAST_FAIL, "streamName": make_stream(1), "checkpointTable": table}
    message = failure_of(spark, options, tmp_path / "ck")
    assert f"DynamoDB table '{table}' has key schema" in message and "checkpointTable" in message
    assert ddb.scan(TableName=table)["Count"] == 0


def test_unknown_shard_in_initial_position_names_it(spark, ddb, make_stream, source_options, tmp_path):
    options = {**source_options, **FAST_FAIL, "streamName": make_stream(1),
               "initialPosition": '{"shardId-000000000042": "TRIM_HORIZON"}'}
    message, rows = runtime_case(spark, ddb, options, tmp_path)
    assert "Option 'initialPosition' names shard 'shardId-000000000042'" in message
    assert rows == []


def test_missing_credentials_fail_clearly(ddb, make_stream, source_options, tmp_path):
    """No keys in the options, none in the environment, no config files, no instance metadata:
    the query fails saying credentials were not found (a separate driver process, since
    Spark's helpers inherit the environment of the process that started the JVM)."""
    options = {k: v for k, v in source_options.items() if k not in ("awsAccessKeyId", "awsSecretKey")}
    options = {**options, **FAST_FAIL, "streamName": make_stream(1)}
    scrub = {k: None for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                               "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                               "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE")}
    scrub.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"),
                 AWS_EC2_METADATA_DISABLED="true")
    driver = ChaosDriver("nocreds", tmp_path, tmp_path / "ck", options, fmt="kinesis-ddb", env=scrub)
    try:
        wait_for(lambda: driver.proc.poll() is not None, timeout=300, what="the query without credentials to fail")
    finally:
        driver.kill()
    message = driver.error() or ""
    assert message, driver.log_path.read_text()[-2000:]
    assert "credentials" in message.lower(), message[-800:]
    assert shard_rows(ddb, options["applicationName"]) == [] and app_rows(ddb, options["applicationName"]) == []
