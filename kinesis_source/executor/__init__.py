"""What runs in Spark's executor Python workers: the frozen partition, the range readers
(polling and fan-out, over one cursor) and the Arrow output.

Never imports ``kinesis_source.driver`` or ``kinesis_source.checkpoints`` (a test proves it):
an executor needs only what its partition carries.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from kinesis_source.aws.clients import shared_client
from kinesis_source.executor.arrow import to_record_batch, user_records
from kinesis_source.executor.fanout import SubscribeRangeReader
from kinesis_source.executor.partition import RangePartition
from kinesis_source.executor.polling import RangeReader
from kinesis_source.executor.report import send_reports

__all__ = ["RangePartition", "read_partition"]


def read_partition(partition: RangePartition) -> Iterator[pa.RecordBatch]:
    """Replay one planned range in order as Arrow batches."""
    rng = partition.range
    client = shared_client(partition.settings, "kinesis")
    reader: RangeReader | SubscribeRangeReader
    if partition.consumer_arn is not None:
        reader = SubscribeRangeReader(client, partition.consumer_arn, rng, partition.fail_on_data_loss)
    else:
        reader = RangeReader(
            client, rng, partition.page_limit, partition.fail_on_data_loss, partition.opener,
            partition.page_interval_s, partition.not_before,
        )
    for records in reader.pages():
        users = user_records(records, rng, partition.on_corrupt, partition.hash_range)
        if users:
            yield to_record_batch(rng.stream, rng.shard_id, users)
    tip = reader.tip_report()
    if partition.report_to is not None and tip is not None:
        send_reports(partition.report_to, [tip])
