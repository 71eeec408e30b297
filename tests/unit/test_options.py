"""Every option: a good value, each kind of bad value, and the message."""

from datetime import datetime, timezone

import pytest

from kinesis_source.errors import OptionError
from kinesis_source.options import SourceOptions, option_specs

BASE = {"streamName": "orders", "applicationName": "orders-etl"}


def parse(**extra):
    return SourceOptions.parse({**BASE, **extra})


def bad(match, **extra):
    with pytest.raises(OptionError) as err:
        parse(**extra)
    message = str(err.value)
    assert match in message, message
    return message


def test_defaults():
    opts = parse()
    assert opts.stream_names == ("orders",)
    assert opts.initial_position.kind == "TRIM_HORIZON"
    assert opts.max_records_per_fetch == 10000
    assert opts.min_probe_interval_ms == 1000
    assert opts.region is None and opts.endpoint_url is None


def test_keys_are_case_insensitive():
    opts = SourceOptions.parse(
        {"STREAMNAME": "a", "applicationname": "x", "maxrecordsperfetch": "5", "Region": "eu-west-1"}
    )
    assert opts.stream_names == ("a",)
    assert opts.max_records_per_fetch == 5
    assert opts.region == "eu-west-1"


def test_stream_name_required_and_validated():
    with pytest.raises(OptionError, match="'streamName' is required"):
        SourceOptions.parse({"applicationName": "x"})
    msg = bad("'streamName'", streamName="bad name!")
    assert "'bad name!'" in msg and "1-128 characters" in msg
    bad("must not be empty", region="  ")
    bad("names a stream twice", streamName="a,a")
    assert parse(streamName="a, b").stream_names == ("a", "b")


def test_unknown_option_is_named_with_a_suggestion():
    msg = bad("Unknown option 'intialPosition'", intialPosition="LATEST")
    assert "did you mean 'initialPosition'" in msg


def test_endpoint_url():
    assert parse(endpointUrl="http://127.0.0.1:4566").endpoint_url == "http://127.0.0.1:4566"
    msg = bad("'endpointUrl' = 'localhost:4566'", endpointUrl="localhost:4566")
    assert "http://" in msg


def test_region():
    assert parse(region="eu-west-1").region == "eu-west-1"
    bad("'region' = ''", region="")


@pytest.mark.parametrize(
    "key,attr,lo,hi",
    [
        ("maxRecordsPerFetch", "max_records_per_fetch", 1, 10000),
        ("minProbeIntervalMs", "min_probe_interval_ms", 0, None),
        ("shardDiscoveryIntervalMs", "shard_discovery_interval_ms", 0, None),
        ("maxRetries", "max_retries", 1, 100),
    ],
)
def test_integer_options(key, attr, lo, hi):
    assert getattr(parse(**{key: str(lo)}), attr) == lo
    if hi is not None:
        assert getattr(parse(**{key: str(hi)}), attr) == hi
        msg = bad(f"'{key}' = '{hi + 1}'", **{key: str(hi + 1)})
        assert f"from {lo} to {hi}" in msg
    msg = bad(f"'{key}' = '{lo - 1}'", **{key: str(lo - 1)})
    assert "an integer" in msg
    bad(f"'{key}' = 'ten'", **{key: "ten"})
    bad(f"'{key}' = '1.5'", **{key: "1.5"})


def test_initial_position_keywords():
    assert parse(initialPosition="latest").initial_position.kind == "LATEST"
    assert parse(initialPosition="TRIM_HORIZON").initial_position.kind == "TRIM_HORIZON"


def test_initial_position_timestamp():
    spec = parse(initialPosition="AT_TIMESTAMP:2026-01-31T12:00:00Z").initial_position
    assert spec.kind == "AT_TIMESTAMP"
    assert spec.timestamp == datetime(2026, 1, 31, 12, tzinfo=timezone.utc)
    # No zone means UTC; offsets are converted.
    assert parse(initialPosition="AT_TIMESTAMP:2026-01-31T13:00:00+01:00").initial_position.timestamp == spec.timestamp
    msg = bad("'initialPosition' = 'AT_TIMESTAMP:yesterday'", initialPosition="AT_TIMESTAMP:yesterday")
    assert "ISO-8601" in msg


def test_initial_position_json():
    spec = parse(initialPosition='{"shardId-000000000001": "42", "shardId-000000000000": "LATEST"}').initial_position
    assert spec.kind == "SHARDS"
    assert dict(spec.shards) == {"shardId-000000000001": "AFTER:42", "shardId-000000000000": "LATEST"}
    assert dict(parse(initialPosition='{"s/shardId-1": "AT:7"}').initial_position.shards) == {"s/shardId-1": "AT:7"}
    bad("is not valid JSON", initialPosition="{nope")
    bad("non-empty JSON object", initialPosition="{}")
    msg = bad("shard 'shardId-1'", initialPosition='{"shardId-1": 42}')
    assert "use a string" in msg
    bad("use a sequence number", initialPosition='{"shardId-1": "yesterday"}')
    msg = bad("'initialPosition' = 'FIRST'", initialPosition="FIRST")
    assert "TRIM_HORIZON, LATEST" in msg
    # the name other connectors use for TRIM_HORIZON is refused, saying so, and said once
    msg = bad("'initialPosition' = 'EARLIEST' is invalid: is what other connectors call TRIM_HORIZON",
              initialPosition="EARLIEST")
    assert msg.count("Option 'initialPosition'") == 1


def test_credentials_rules_and_secret_never_shown():
    opts = parse(awsAccessKeyId="AKIAEXAMPLE", awsSecretKey="s3cr3t-value", awsSessionToken="tok-3n")
    assert opts.aws_secret_key == "s3cr3t-value"
    assert "s3cr3t-value" not in repr(opts) and "tok-3n" not in repr(opts)
    bad("must be given together", awsAccessKeyId="AKIAEXAMPLE")
    bad("must be given together", awsSecretKey="s3cr3t-value")
    bad("'awsSessionToken' needs", awsSessionToken="tok")
    bad("exclude each other", profile="dev", awsAccessKeyId="A", awsSecretKey="B")
    msg = bad("'awsSecretKey' = <redacted>", awsSecretKey="   ")
    assert parse(profile="dev").profile == "dev"
    bad("'profile' = ''", profile="")
    assert "   " not in msg.split("=", 1)[1].split(":")[0]


def test_every_declared_option_has_key_type_and_doc():
    specs = option_specs()
    keys = [s["key"] for s in specs]
    assert len(keys) == len({k.lower() for k in keys})
    for spec in specs:
        assert spec["type"] and spec["doc"].strip(), spec


def test_checkpoint_options():
    opts = parse()
    assert opts.application_name == "orders-etl"
    assert opts.checkpoint_table == "kinesis_ddb_checkpoints"
    assert opts.create_table is True
    assert opts.on_commit is None and opts.on_commit_errors == "fail"
    with pytest.raises(OptionError, match="'applicationName' is required"):
        SourceOptions.parse({"streamName": "s"})
    bad("'applicationName' = 'a b'", applicationName="a b")
    assert parse(checkpointTable="my.table-1").checkpoint_table == "my.table-1"
    msg = bad("'checkpointTable' = 'ab'", checkpointTable="ab")
    assert "3-255 characters" in msg
    assert parse(createTable="FALSE").create_table is False
    bad("'createTable' = 'no'", createTable="no")
    assert parse(dynamodbEndpointUrl="http://127.0.0.1:1").dynamodb_endpoint_url == "http://127.0.0.1:1"
    bad("'dynamodbEndpointUrl' = 'nope'", dynamodbEndpointUrl="nope")
    assert parse(dynamodbRegion="eu-west-1").dynamodb_region == "eu-west-1"
    bad("'dynamodbRegion' = ''", dynamodbRegion="")
    assert parse(onCommit="my_pkg.hooks:on_commit").on_commit == "my_pkg.hooks:on_commit"
    msg = bad("'onCommit' = 'my_pkg.hooks.on_commit'", onCommit="my_pkg.hooks.on_commit")
    assert "package.module:function" in msg
    assert parse(onCommitErrors="LOG").on_commit_errors == "log"
    bad("must be one of fail, log", onCommitErrors="ignore")


def test_efo_options_need_efo_mode():
    base = {"streamName": "s", "applicationName": "a"}
    with pytest.raises(OptionError, match="consumerName.*consumerMode=efo"):
        SourceOptions.parse({**base, "consumerName": "c"})
    opts = SourceOptions.parse({**base, "consumerMode": "EFO", "deregisterConsumer": "true"})
    assert opts.consumer_mode == "efo" and opts.deregister_consumer


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("startingposition", "'startingposition' is kinesis-sql's option, here it is 'initialPosition'"),
        ("kinesis.startingPosition", "is the AWS connector's option, here it is 'initialPosition'"),
        ("kinesis.endpointUrl", "is the AWS connector's option, here it is 'endpointUrl'"),
        ("kinesis.maxFetchTimePerShardSec", "is the AWS connector's option; kinesis-ddb has none ("),
        ("awsAccessKey", "is Databricks' Kinesis source's option, here it is 'awsAccessKeyId'"),
        ("spark.kinesis.region", "options take no prefix here, use 'region'"),
        ("maxRecordPerBatch", "did you mean 'maxRecordsPerBatch'?"),
    ],
)
def test_unknown_option_says_what_to_write_instead(key, hint):
    msg = bad(f"Unknown option '{key}'", **{key: "x"})
    assert hint in msg, msg
    # the pointer works where the package is installed without this repository's docs
    assert "`kinesis-ddb options` lists every option" in msg
    assert "did you mean 'stsEndpointUrl'" not in msg


def test_unknown_option_with_nothing_close_gets_no_guess():
    msg = bad("Unknown option 'colour'", colour="red")
    assert "did you mean" not in msg and "here it is" not in msg and "use '" not in msg


def test_earliest_is_named_as_other_connectors_trim_horizon():
    bad("is what other connectors call TRIM_HORIZON: write TRIM_HORIZON", initialPosition="earliest")


ARN_A = "arn:aws:kinesis:eu-west-1:111122223333:stream/orders"
ARN_B = "arn:aws:kinesis:eu-west-1:444455556666:stream/clicks"


def test_streams_by_arn_give_their_names_and_region():
    opts = SourceOptions.parse({"streamARN": f"{ARN_A}, {ARN_B}", "applicationName": "x"})
    assert opts.stream_names == ("orders", "clicks")
    assert opts.region == "eu-west-1"
    assert opts.stream_arn_map == {"orders": ARN_A, "clicks": ARN_B}
    assert parse(streamName="a").stream_arn_map == {}
    same = SourceOptions.parse({"streamARN": ARN_A, "applicationName": "x", "region": "eu-west-1"})
    assert same.region == "eu-west-1"


def test_streams_by_arn_refuse_what_cannot_be_read_in_one_query():
    def refused(match: str, **raw: str) -> None:
        with pytest.raises(OptionError, match=match):
            SourceOptions.parse({"applicationName": "x", **raw})

    refused("not a Kinesis stream ARN", streamARN="arn:aws:sqs:eu-west-1:111122223333:queue")
    refused("not a Kinesis stream ARN", streamARN="orders")
    refused("same name", streamARN=f"{ARN_A},{ARN_A.replace('111122223333', '999999999999')}")
    refused("several regions", streamARN=f"{ARN_A},{ARN_B.replace('eu-west-1', 'us-east-1')}")
    refused("exclude each other", streamARN=ARN_A, streamName="orders")
    refused("differs from the region", streamARN=ARN_A, region="us-east-1")
    refused("'streamName' is required", awsAccessKeyId="k", awsSecretKey="s")
