"""An iterator older than 5 minutes, on kinesis-local (it expires iterators after 300 s).

The scenario runs on a kinesis-local of its own whose clock it moves 5 minutes ahead
(``KinesisLocal(clock=True)``): the server expires the reader's iterator exactly as it would
after 5 real minutes, with the same check of the iterator's age, and the test takes seconds.
"""

from __future__ import annotations

import uuid

import boto3

from kinesis_source.aws.clients import AwsSettings, error_code
from kinesis_source.executor.polling import RangeReader
from kinesis_source.positions import Position, ShardRange
from tests.support.kinesis_local import KinesisLocal
from tests.support.waiting import wait_for

EXPIRY_S = 300  # kinesis-local's (and Kinesis's) iterator lifetime


def _expired(client, iterator: str) -> bool:
    try:
        client.get_records(ShardIterator=iterator, Limit=1)
        return False
    except Exception as exc:  # noqa: BLE001 - only the expiry code counts
        if error_code(exc) == "ExpiredIteratorException":
            return True
        raise


def run() -> dict:
    """Read 40 of 100 records, let 5 minutes and a second pass on the server, read the rest."""
    with KinesisLocal(clock=True) as server:
        client = boto3.client("kinesis", endpoint_url=server.url, region_name="us-east-1")
        stream = f"expiry-{uuid.uuid4().hex[:8]}"
        client.create_stream(StreamName=stream, ShardCount=1)
        wait_for(lambda: client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]
                 ["StreamStatus"] == "ACTIVE", timeout=30, what=f"stream {stream} ACTIVE")
        resp = client.put_records(
            StreamName=stream,
            Records=[{"Data": f"r-{i}".encode(), "PartitionKey": "k"} for i in range(100)],
        )
        seqs = [r["SequenceNumber"] for r in resp["Records"]]
        shard = resp["Records"][0]["ShardId"]
        reader = RangeReader(
            AwsSettings(region="us-east-1", endpoint_url=server.url).boto3_client("kinesis"),
            ShardRange(stream, shard, Position.trim_horizon(), seqs[-1]),
            limit=40,
        )
        pages = reader.pages()
        got = [r["SequenceNumber"] for r in next(pages)]
        witness = client.get_shard_iterator(
            StreamName=stream, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        assert not _expired(client, witness)
        server.run_ahead(EXPIRY_S + 1)
        # a twin of the reader's iterator, made as late: once it is expired, so is the reader's
        wait_for(lambda: _expired(client, witness), timeout=30, what="the server to expire a 5-minute-old iterator")
        for page in pages:
            got += [r["SequenceNumber"] for r in page]
    return {"sent": seqs, "got": got, "expiries": reader.expiries}
