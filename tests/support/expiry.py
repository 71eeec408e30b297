"""An iterator older than 5 minutes, on kinesis-local (it expires iterators after 300 s).

The wait is real time on the server's clock, so the scenario runs in a background thread from
the moment kinesis-local starts, while the other tests run; the test at the end of the session
(tests/integration/test_zz_iterator_expiry.py) collects its result.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import Future

import boto3

from kinesis_source.aws.clients import AwsSettings, error_code
from kinesis_source.executor.polling import RangeReader
from kinesis_source.positions import Position, ShardRange

EXPIRY_DEADLINE_S = 420  # kinesis-local expires iterators after 300 s


def _expired(client, iterator: str) -> bool:
    try:
        client.get_records(ShardIterator=iterator, Limit=1)
        return False
    except Exception as exc:  # noqa: BLE001 - only the expiry code counts
        if error_code(exc) == "ExpiredIteratorException":
            return True
        raise


def run(url: str) -> dict:
    """Read 40 of 100 records, wait until iterators of that age are expired, read the rest."""
    client = boto3.client("kinesis", endpoint_url=url, region_name="us-east-1")
    stream = f"expiry-{uuid.uuid4().hex[:8]}"
    client.create_stream(StreamName=stream, ShardCount=1)
    while client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamStatus"] != "ACTIVE":
        time.sleep(0.1)
    resp = client.put_records(
        StreamName=stream,
        Records=[{"Data": f"r-{i}".encode(), "PartitionKey": "k"} for i in range(100)],
    )
    seqs = [r["SequenceNumber"] for r in resp["Records"]]
    shard = resp["Records"][0]["ShardId"]
    reader = RangeReader(
        AwsSettings(region="us-east-1", endpoint_url=url).boto3_client("kinesis"),
        ShardRange(stream, shard, Position.trim_horizon(), seqs[-1]),
        limit=40,
    )
    pages = reader.pages()
    got = [r["SequenceNumber"] for r in next(pages)]
    witness = client.get_shard_iterator(
        StreamName=stream, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    started = time.monotonic()
    while not _expired(client, witness):  # a twin of the reader's iterator, made as late
        if time.monotonic() - started > EXPIRY_DEADLINE_S:
            raise AssertionError("kinesis-local did not expire an iterator in time")
        time.sleep(5)
    for page in pages:
        got += [r["SequenceNumber"] for r in page]
    return {"sent": seqs, "got": got, "expiries": reader.expiries, "waited": time.monotonic() - started}


def start(url: str) -> Future:
    """Run the scenario in a daemon thread; its result (or error) arrives in the future."""
    future: Future = Future()

    def target() -> None:
        try:
            future.set_result(run(url))
        except BaseException as exc:  # reported by the test
            future.set_exception(exc)

    threading.Thread(target=target, daemon=True, name="iterator-expiry").start()
    return future
