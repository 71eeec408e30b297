"""What runs in Spark's executor Python workers: the frozen partition, the range readers
(polling and fan-out, over one cursor) and the Arrow output.

Never imports ``kinesis_source.driver`` or ``kinesis_source.checkpoints`` (a test proves it):
an executor needs only what its partition carries.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from kinesis_source.aws.clients import shared_client
from kinesis_source.aws.kinesis import note_receipts
from kinesis_source.executor.arrow import to_record_batch, user_records
from kinesis_source.executor.fanout import SubscribeRangeReader
from kinesis_source.executor.interleave import interleave
from kinesis_source.executor.partition import RangePartition, ShardRead
from kinesis_source.executor.polling import RangeReader
from kinesis_source.executor.report import send_reports
from kinesis_source.tip_reports import messages, within_carry_budget

__all__ = ["RangePartition", "ShardRead", "read_partition"]

# Shards of one task read at once (each mostly waits: for Kinesis, and for its call budget).
READ_THREADS = 16
# Arrow batches waiting to be yielded, per reading thread: bounds a task's memory.
QUEUED_PER_THREAD = 2

Reader = RangeReader | SubscribeRangeReader


def read_partition(partition: RangePartition) -> Iterator[pa.RecordBatch]:
    """Replay a task's planned ranges, each in order, as Arrow batches; then report to the
    driver what the reads saw past their ends."""
    client = shared_client(partition.settings, "kinesis")
    note_receipts(client)
    readers = [_reader(client, partition, read) for read in partition.reads]
    shards = [_batches(partition, read, reader) for read, reader in zip(partition.reads, readers, strict=True)]
    if len(shards) == 1:
        yield from shards[0]
    else:
        threads = min(READ_THREADS, len(shards))
        yield from interleave(shards, threads, threads * QUEUED_PER_THREAD)
    tips = [tip for reader in readers if (tip := reader.tip_report()) is not None]
    # A read whose subscription went on as the shard's tip watch says so with its report: the
    # driver then leaves the shard to the watch from the moment the read's report lands.
    tips += [watched for reader in readers
             if isinstance(reader, SubscribeRangeReader) and (watched := reader.watch_report()) is not None]
    if partition.report_to is not None and tips:
        for message in messages(within_carry_budget(tips)):
            send_reports(partition.report_to, message)


def attempt_number() -> int:
    """Which attempt of its task this is (0: the first; a retried or speculative task's is
    higher). 0 outside a Spark task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.attemptNumber() if context is not None else 0


def _reader(client: Any, partition: RangePartition, read: ShardRead) -> Reader:
    if read.consumer_arn is not None:
        watch_to = partition.report_to if partition.watch_tips else None
        return SubscribeRangeReader(client, read.consumer_arn, read.range, partition.fail_on_data_loss,
                                    watch_to=watch_to)
    return RangeReader(
        client, read.range, partition.page_limit, partition.fail_on_data_loss, read.opener,
        partition.page_interval_s, read.not_before, read.records, read.rate, partition.max_rate,
        partition.settings.max_retries + 1, dict(partition.settings.stream_arns).get(read.range.stream),
        partition.held_interval_s, read.end_at, read.carried, read.second_at, attempt_number() > 0,
    )


def _batches(partition: RangePartition, read: ShardRead, reader: Reader) -> Iterator[pa.RecordBatch]:
    rng = read.range
    for records in reader.pages():
        users = user_records(records, rng, partition.on_corrupt, read.hash_range)
        if users:
            yield to_record_batch(rng.stream, rng.shard_id, users)
