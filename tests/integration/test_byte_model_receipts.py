"""A read's byte model charges each page when its answer arrived, not when botocore finished
parsing it: the shard's bucket refills from the moment the answer left Kinesis (real HTTP to
the backend under test; a slow parse is made slower on purpose)."""

from __future__ import annotations

import threading
import time

import boto3

from kinesis_source.aws.kinesis import note_receipts, received_at
from kinesis_source.executor.polling import RangeReader
from kinesis_source.positions import Position, ShardRange
from kinesis_source.read_rate import SHARD_BURST_BYTES

RECORDS, RECORD_BYTES = 5, 250_000
SLOW_PARSE_S = 0.8  # refills 1.6 MiB at 2 MiB/s: more than the page's 1.25 MB


def _client(url: str, receipts: bool, slow_parse: bool) -> object:
    client = boto3.client("kinesis", endpoint_url=url, region_name="us-east-1")
    if receipts:
        note_receipts(client)
    if slow_parse:  # registered after note_receipts: runs after the receipt was noted
        client.meta.events.register("before-parse.kinesis.GetRecords", lambda **_: time.sleep(SLOW_PARSE_S))
    return client


def _filled(kinesis, make_stream) -> ShardRange:
    stream = make_stream(1)
    shard = kinesis.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    last = None
    for i in range(RECORDS):
        last = kinesis.put_record(StreamName=stream, Data=bytes([i]) * RECORD_BYTES, PartitionKey="k")["SequenceNumber"]
    return ShardRange(stream, shard, Position.trim_horizon(), last)


def _level_after_read(client, rng: ShardRange) -> float:
    reader = RangeReader(client, rng, 10_000)
    read = sum(len(page) for page in reader.pages())
    assert read == RECORDS
    return reader.bytes.state(time.time()).level


def test_a_slowly_parsed_page_is_charged_when_it_arrived(kinesis_backend, kinesis, make_stream) -> None:
    rng = _filled(kinesis, make_stream)
    # From a full bucket: charged on arrival, the half second of parsing refilled it.
    assert _level_after_read(_client(kinesis_backend, True, True), rng) == SHARD_BURST_BYTES
    # Without the receipt the same read is charged after the parse, and the model is short
    # (by the page, less what refilled between the parse's end and the look: milliseconds).
    assert _level_after_read(_client(kinesis_backend, False, True), rng) < SHARD_BURST_BYTES - 500_000


def test_receipts_are_per_thread_and_read_once(kinesis_backend, kinesis, make_stream) -> None:
    rng = _filled(kinesis, make_stream)
    client = _client(kinesis_backend, True, False)
    it = client.get_shard_iterator(StreamName=rng.stream, ShardId=rng.shard_id,
                                   ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    called = time.time()
    client.get_records(ShardIterator=it, Limit=1)
    assert called <= received_at(default=float("inf")) <= time.time()
    assert received_at(default=float("inf")) == float("inf")  # forgotten once read
    elsewhere: list[float] = []
    thread = threading.Thread(target=lambda: elsewhere.append(received_at(default=-2.0)))
    client.get_records(ShardIterator=it, Limit=1)  # noted for this thread only
    thread.start()
    thread.join()
    assert elsewhere == [-2.0] and received_at(default=float("inf")) <= time.time()
