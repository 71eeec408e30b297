"""The naive baseline: a driver-side ``SimpleDataSourceStreamReader`` that reads every shard on
the driver, the approach blog posts show. ``format("kinesis-naive")`` after
``spark.dataSource.register(NaiveKinesisDataSource)``.

Each ``read(start)`` opens an iterator after each shard's last position and reads it with boto3
to its tip, one shard after another, returning every record as a row and the new positions.
Spark then ships the rows from the driver's Python helper to the JVM; nothing runs on executors.
Options: ``streamName``, ``endpointUrl``, ``region``, ``accessKeyId`` (credentials from the
environment, this key id if given: a quota proxy tells callers apart by it). botocore's standard
retry mode retries a refused call after its backoff (``max_attempts`` raised so that no read
gives up), as for the raw loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader

from kinesis_source.executor.arrow import SCHEMA_DDL

PAGE_LIMIT = 10000
MAX_ATTEMPTS = 50


class NaiveKinesisDataSource(DataSource):
    """``format("kinesis-naive")``: the same schema as kinesis-ddb, read on the driver."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return "kinesis-naive"

    def schema(self) -> str:
        """kinesis-ddb's output schema, so both feed the same sink."""
        return SCHEMA_DDL

    def simpleStreamReader(self, schema: Any) -> NaiveKinesisReader:
        """The driver-side reader."""
        return NaiveKinesisReader(dict(self.options))


class NaiveKinesisReader(SimpleDataSourceStreamReader):
    """Offsets are ``{shardId: last sequence number read or None}``."""

    def __init__(self, options: dict[str, str]) -> None:
        lower = {k.lower(): v for k, v in options.items()}  # Spark's option keys ignore case
        self._stream = lower["streamname"]
        self._endpoint = lower.get("endpointurl")
        self._region = lower.get("region", "us-east-1")
        self._key = lower.get("accesskeyid")
        self._client: Any = None

    def _kinesis(self) -> Any:
        if self._client is None:
            import os

            import boto3
            from botocore.config import Config

            creds = {}
            if self._key:
                creds = {"aws_access_key_id": self._key,
                         "aws_secret_access_key": os.environ.get("AWS_SECRET_ACCESS_KEY", "naive")}
            self._client = boto3.client(
                "kinesis", endpoint_url=self._endpoint, region_name=self._region, **creds,
                config=Config(retries={"mode": "standard", "max_attempts": MAX_ATTEMPTS}),
            )
        return self._client

    def initialOffset(self) -> dict:
        """Every shard from its beginning."""
        shards = self._kinesis().list_shards(StreamName=self._stream)["Shards"]
        return {s["ShardId"]: None for s in sorted(shards, key=lambda s: s["ShardId"])}

    def _read_shard(self, shard: str, after: str | None, upto: str | None) -> tuple[list, str | None]:
        client = self._kinesis()
        args = (
            {"ShardIteratorType": "AFTER_SEQUENCE_NUMBER", "StartingSequenceNumber": after}
            if after
            else {"ShardIteratorType": "TRIM_HORIZON"}
        )
        it = client.get_shard_iterator(StreamName=self._stream, ShardId=shard, **args)["ShardIterator"]
        rows, last = [], after
        while it:
            page = client.get_records(ShardIterator=it, Limit=PAGE_LIMIT)
            for r in page["Records"]:
                if upto is not None and int(r["SequenceNumber"]) > int(upto):
                    return rows, last
                rows.append(
                    (r["Data"], self._stream, shard, r["PartitionKey"], r["SequenceNumber"], 0,
                     r["ApproximateArrivalTimestamp"])
                )
                last = r["SequenceNumber"]
            if upto is not None and last == upto:
                return rows, last
            if not page["Records"] and page.get("MillisBehindLatest", 0) == 0:
                return rows, last  # at the tip
            it = page.get("NextShardIterator")
        return rows, last

    def read(self, start: dict) -> tuple[Iterator[tuple], dict]:
        """Every new record of every shard, read on the driver, and the positions after them."""
        rows, end = [], {}
        for shard in sorted(start):
            got, last = self._read_shard(shard, start[shard], None)
            rows += got
            end[shard] = last
        return iter(rows), end

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[tuple]:
        """The records between two offsets again (a replayed batch)."""
        rows: list[tuple] = []
        for shard in sorted(end):
            if end[shard] != start.get(shard):
                rows += self._read_shard(shard, start.get(shard), end[shard])[0]
        return iter(rows)

    def commit(self, end: dict) -> None:
        """Nothing to store: the offsets live in Spark's checkpoint."""
