"""Parsing Kinesis' answers: a GetRecords page decoded in one pass gives what botocore's walk
gives, and anything else is left to that walk."""

from __future__ import annotations

import base64
import json

import botocore.session
import pytest
from botocore.parsers import ResponseParserFactory

from kinesis_source.aws.clients import AwsSettings
from kinesis_source.aws.parsing import KINESIS_PARSER_DEFAULTS, KinesisParserFactory, PageParser

_MODEL = botocore.session.get_session().get_service_model("kinesis")


def _botocore() -> object:
    factory = ResponseParserFactory()
    factory.set_parser_defaults(**KINESIS_PARSER_DEFAULTS)
    return factory.create_parser("json")


def _parse(parser, body: object, operation: str = "GetRecords", status: int = 200) -> dict:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    http = {"body": raw, "headers": {"x-amzn-requestid": "r-1"}, "status_code": status}
    return parser.parse(http, _MODEL.operation_model(operation).output_shape)


def _record(i: int, **extra) -> dict:
    return {"SequenceNumber": str(10**55 + i), "ApproximateArrivalTimestamp": 1_790_000_000.25 + i,
            "Data": base64.b64encode(bytes([i % 256]) * (i % 5)).decode(), "PartitionKey": f"k{i}", **extra}


PAGES = {
    "plain records": {"Records": [_record(i) for i in range(7)], "NextShardIterator": "it", "MillisBehindLatest": 12},
    "no records, at the tip": {"Records": [], "NextShardIterator": "it", "MillisBehindLatest": 0},
    "encrypted, whole-second arrivals": {
        "Records": [_record(1, EncryptionType="KMS", ApproximateArrivalTimestamp=1_790_000_001)],
        "NextShardIterator": "it", "MillisBehindLatest": 0},
    "a closed shard's last page": {
        "Records": [_record(2)], "MillisBehindLatest": 0,
        "ChildShards": [{"ShardId": "shardId-000000000002", "ParentShards": ["shardId-000000000000"],
                         "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "9"}}]},
    "null members": {"Records": [_record(3)], "NextShardIterator": None, "MillisBehindLatest": 5},
    "a null record member": {"Records": [_record(4, EncryptionType=None)], "NextShardIterator": "it"},
    "an unknown record member": {"Records": [_record(5, Shiny=1)], "NextShardIterator": "it"},
    "an unknown page member": {"Records": [_record(6)], "NextShardIterator": "it", "Extra": {"a": 1}},
    "an ISO arrival": {"Records": [_record(7, ApproximateArrivalTimestamp="2026-11-27T10:00:00.5Z")]},
    "a record without data": {"Records": [{"SequenceNumber": "1", "PartitionKey": "k"}]},
    "records not a list": {"Records": {"a": 1}},
    "not json": b"<html>oops</html>",
}


def _outcome(parser, body: object) -> object:
    """What parsing ``body`` gives, or the type of what it raises."""
    try:
        return _parse(parser, body)
    except Exception as exc:  # noqa: BLE001 - compared below
        return type(exc)


@pytest.mark.parametrize("name", sorted(PAGES))
def test_a_page_parses_as_botocores_walk_parses_it(name):
    ours = PageParser(**KINESIS_PARSER_DEFAULTS)
    assert _outcome(ours, PAGES[name]) == _outcome(_botocore(), PAGES[name])


@pytest.mark.parametrize("parser", [PageParser(**KINESIS_PARSER_DEFAULTS), _botocore()], ids=["ours", "botocore"])
def test_a_plain_page_is_decoded_without_walking_its_records(parser, monkeypatch):
    """The point of the parser: botocore's walk parses every member of every record as a shape
    of its own (here 39: the page, its list, 7 records of 4 members each, and 2 more members);
    the one pass parses the page as one structure."""
    walked = []
    original = type(parser)._parse_shape
    monkeypatch.setattr(parser, "_parse_shape",
                        lambda shape, node: walked.append(shape.name) or original(parser, shape, node))
    _parse(parser, PAGES["plain records"])
    assert len(walked) == (1 if isinstance(parser, PageParser) else 39)


def test_other_answers_and_errors_are_botocores():
    ours = PageParser(**KINESIS_PARSER_DEFAULTS)
    listing = {"Shards": [{"ShardId": "shardId-000000000000", "SequenceNumberRange": {"StartingSequenceNumber": "1"},
                           "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "9"}}], "Unmodelled": 1}
    assert _parse(ours, listing, "ListShards") == _parse(_botocore(), listing, "ListShards")
    refused = {"__type": "ProvisionedThroughputExceededException", "message": "Rate exceeded for shard"}
    assert _parse(ours, refused, status=400) == _parse(_botocore(), refused, status=400)
    assert _parse(ours, refused, status=400)["Error"]["Code"] == "ProvisionedThroughputExceededException"


def test_the_synchronous_kinesis_clients_use_the_page_parser():
    settings = AwsSettings(region="us-east-1", endpoint_url="http://127.0.0.1:1", access_key_id="a", secret_key="b")
    # (botocore's endpoint makes a parser from the session's factory for every answer)
    factory = settings.boto3_client("kinesis")._endpoint._response_parser_factory
    assert isinstance(factory, KinesisParserFactory) and isinstance(factory.create_parser("json"), PageParser)
    assert not isinstance(settings.boto3_client("dynamodb")._endpoint._response_parser_factory, KinesisParserFactory)


EVENTS = {
    "records": {"Records": [_record(i) for i in range(5)], "ContinuationSequenceNumber": "42", "MillisBehindLatest": 7},
    "none, caught up": {"Records": [], "ContinuationSequenceNumber": "42", "MillisBehindLatest": 0},
    "the shard's end": {"Records": [], "MillisBehindLatest": 0,
                        "ChildShards": [{"ShardId": "shardId-000000000003", "ParentShards": ["shardId-000000000001"],
                                         "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "9"}}]},
    "an unknown record member": {"Records": [_record(1, Shiny=True)], "ContinuationSequenceNumber": "1"},
}


def _events(parser, body: dict) -> list:
    from botocore.eventstream import EventStream

    from tests.support.efo_server import RawEvents, encode_event

    shape = _MODEL.operation_model("SubscribeToShard").output_shape.members["EventStream"]
    data = encode_event("initial-response", {}) + encode_event("SubscribeToShardEvent", json.loads(json.dumps(body)))
    stream = EventStream(RawEvents(data), shape, parser, "SubscribeToShard")
    stream.get_initial_response()
    return list(stream)


@pytest.mark.parametrize("name", sorted(EVENTS))
def test_a_fan_out_event_parses_as_botocores_walk_parses_it(name):
    from botocore.parsers import EventStreamJSONParser

    ours = PageParser(**KINESIS_PARSER_DEFAULTS)._event_stream_parser
    assert isinstance(ours, EventStreamJSONParser) and type(ours) is not EventStreamJSONParser
    assert _events(ours, EVENTS[name]) == _events(EventStreamJSONParser(**KINESIS_PARSER_DEFAULTS), EVENTS[name])
