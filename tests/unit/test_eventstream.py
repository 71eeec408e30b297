"""The test EFO server's event-stream encoder, checked against botocore's own decoder."""

from __future__ import annotations

import json

import pytest
from botocore.eventstream import ChecksumMismatch, EventStream, EventStreamBuffer
from botocore.exceptions import EventStreamError
from botocore.parsers import EventStreamJSONParser

from kinesis_source.aws.parsing import epoch_seconds
from tests.support.efo_server import RawEvents, encode_event, encode_exception, encode_message


def _decode(data: bytes) -> list:
    buf = EventStreamBuffer()
    buf.add_data(data)
    return list(buf)


def test_headers_and_payload_round_trip():
    headers = {":message-type": "event", "s": "värde", "b": b"\x00\xff", "t": True, "f": False,
               "i": -7, "l": 2**40}
    [msg] = _decode(encode_message(headers, b"payload"))
    assert msg.headers == headers
    assert msg.payload == b"payload"


def test_several_messages_and_split_chunks():
    frames = [encode_event("SubscribeToShardEvent", {"n": i}) for i in range(5)]
    data = b"".join(frames)
    buf = EventStreamBuffer()
    out = []
    for i in range(0, len(data), 7):  # arbitrary chunking, as HTTP may deliver it
        buf.add_data(data[i : i + 7])
        out.extend(buf)
    assert [json.loads(m.payload)["n"] for m in out] == list(range(5))
    assert {m.headers[":event-type"] for m in out} == {"SubscribeToShardEvent"}


@pytest.mark.parametrize("where", [1, 5, 20, -2])  # prelude length, prelude CRC, payload, CRC
def test_corrupted_frame_is_refused(where):
    frame = bytearray(encode_event("SubscribeToShardEvent", {"Records": []}))
    frame[where] ^= 0x01
    with pytest.raises(ChecksumMismatch):
        _decode(bytes(frame))


def _kinesis_event_stream(data: bytes) -> EventStream:
    import botocore.session

    model = botocore.session.get_session().get_service_model("kinesis")
    shape = model.operation_model("SubscribeToShard").output_shape.members["EventStream"]
    parser = EventStreamJSONParser(timestamp_parser=epoch_seconds)
    return EventStream(RawEvents(data), shape, parser, "SubscribeToShard")


def test_kinesis_events_parse_with_the_service_model():
    record = {"SequenceNumber": "42", "ApproximateArrivalTimestamp": 1700000000.123,
              "Data": "aGk=", "PartitionKey": "k"}
    body = {"Records": [record], "ContinuationSequenceNumber": "42", "MillisBehindLatest": 7}
    data = encode_event("initial-response", {}) + encode_event("SubscribeToShardEvent", body)
    stream = _kinesis_event_stream(data)
    assert stream.get_initial_response().headers[":event-type"] == "initial-response"
    [event] = list(stream)
    parsed = event["SubscribeToShardEvent"]
    assert parsed["Records"] == [
        {"SequenceNumber": "42", "ApproximateArrivalTimestamp": 1700000000.123, "Data": b"hi",
         "PartitionKey": "k"}
    ]
    assert parsed["ContinuationSequenceNumber"] == "42" and parsed["MillisBehindLatest"] == 7


def test_exception_event_raises_with_its_code():
    failure = encode_exception("InternalFailureException", "boom")
    data = encode_event("initial-response", {}) + failure
    stream = _kinesis_event_stream(data)
    stream.get_initial_response()
    with pytest.raises(EventStreamError) as info:
        list(stream)
    assert info.value.response["Error"] == {"Code": "InternalFailureException", "Message": "boom"}
