"""A read Spark runs again (a retried task, a speculative copy) on the quota-enforcing server:
its partition's byte state was spent by the first attempt, and the second must neither overdraw
the shard nor take its own first attempt for another application (issue 46 item 3)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from pyspark import TaskContext

from kinesis_source.aws.clients import AwsSettings
from kinesis_source.driver.reports import TipListener
from kinesis_source.executor import RangePartition, ShardRead, read_partition
from kinesis_source.options import SourceOptions
from kinesis_source.positions import Position, ShardRange
from kinesis_source.read_rate import SHARD_BURST_BYTES, RateState
from kinesis_source.tip_reports import TipReport
from tests.support.quota import QuotaProxy
from tests.support.waiting import wait_for

RECORDS, RECORD_BYTES = 130, 100_000  # 13 MB: more than the shard's 10 MiB bucket


def _filled(kinesis, make_stream) -> ShardRange:
    stream = make_stream(1)
    shard = kinesis.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    last = None
    for first in range(0, RECORDS, 40):
        entries = [{"Data": bytes([i % 256]) * RECORD_BYTES, "PartitionKey": "k"}
                   for i in range(first, min(RECORDS, first + 40))]
        last = kinesis.put_records(StreamName=stream, Records=entries)["Records"][-1]["SequenceNumber"]
    return ShardRange(stream, shard, Position.trim_horizon(), last)


class _Attempt:
    """Runs the code inside as Spark's attempt ``n`` of a task (the worker's TaskContext)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __enter__(self) -> None:
        context = TaskContext._getOrCreate()
        context._attemptNumber = self.n
        TaskContext._setTaskContext(context)

    def __exit__(self, *exc) -> None:
        TaskContext._setTaskContext(None)  # type: ignore[arg-type]


@pytest.mark.backends("moto")  # the executor's byte model: the same on either server
def test_a_retried_read_starts_no_fuller_than_the_shard_and_learns_no_phantom_neighbour(
    kinesis, kinesis_backend, make_stream, source_options
):
    rng = _filled(kinesis, make_stream)
    reports: list[TipReport] = []
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    listener = TipListener("127.0.0.1", reports.extend)
    try:
        address = asyncio.run_coroutine_threadsafe(listener.start(), loop).result(10)
        with QuotaProxy(kinesis_backend) as quota:
            opts = SourceOptions.parse({**source_options, "streamName": rng.stream, "endpointUrl": quota.url})
            # as the driver hands a read out of a shard nobody read lately, its records probed
            read = ShardRead(rng, records=RECORDS,
                             rate=RateState(SHARD_BURST_BYTES, time.time(), record_bytes=RECORD_BYTES + 1))
            partition = RangePartition.of(read, AwsSettings.for_kinesis(opts), opts, address)
            with _Attempt(0):  # the first attempt reads the whole range, then its task fails
                first = sum(b.num_rows for b in read_partition(partition))
            wait_for(lambda: len(reports) == 1, timeout=30, what="the first attempt's report")
            since = time.monotonic()
            with _Attempt(1):  # Spark retries the task: the same frozen partition
                second = sum(b.num_rows for b in read_partition(partition))
            wait_for(lambda: len(reports) == 2, timeout=30, what="the retry's report")
            refused = quota.refused(where=lambda s: s.at >= since)
    finally:
        loop.call_soon_threadsafe(listener.close)
        loop.call_soon_threadsafe(loop.stop)
    assert first == second == RECORDS
    assert refused == 0, "the retry started from a state no fuller than the shard's"
    retry = reports[1]
    assert retry.rate is not None and retry.rate.others == 0.0, "no neighbour learnt from its own first attempt"
    assert retry.throttled == 0
