"""An independent oracle for what a planned range holds: plain boto3 calls, no code of ours.

The readers under test (polling and fan-out) share :class:`kinesis_source.executor.cursor.RangeCursor`,
:func:`~kinesis_source.executor.cursor.check_opening` and
:func:`~kinesis_source.executor.cursor.opening_position`; comparing one with the other would pass a bug
they share. This reads with the iterator type the position names (``AFTER:s`` is
``AFTER_SEQUENCE_NUMBER``, no opening one record early, no check record to drop) and cuts at the
end by integer comparison, written out here.
"""

from __future__ import annotations

from datetime import datetime, timezone


def _iterator_args(start: str) -> dict:
    kind, _, rest = start.partition(":")
    if kind == "TRIM_HORIZON":
        return {"ShardIteratorType": "TRIM_HORIZON"}
    if kind == "AT_TIMESTAMP":
        ts = datetime.fromisoformat(rest.replace("Z", "+00:00")).astimezone(timezone.utc)
        return {"ShardIteratorType": "AT_TIMESTAMP", "Timestamp": ts}
    if kind == "AT":
        return {"ShardIteratorType": "AT_SEQUENCE_NUMBER", "StartingSequenceNumber": rest}
    if kind == "AFTER":
        # AFTER:<seq>:<sub> as delivered rows of un-aggregated records: after the record <seq>
        return {"ShardIteratorType": "AFTER_SEQUENCE_NUMBER", "StartingSequenceNumber": rest.split(":")[0]}
    raise AssertionError(f"unexpected range start {start}")


def read_range_boto3(kinesis, stream: str, shard: str, start: str, end_seq: str) -> list[dict]:
    """The records (as ``GetRecords`` returns them) of ``stream``/``shard`` from ``start`` (a
    position string: ``TRIM_HORIZON``, ``AT_TIMESTAMP:<iso>``, ``AT:<seq>``, ``AFTER:<seq>``)
    up to and including ``end_seq``, read with plain ``GetShardIterator``/``GetRecords``.
    Raises AssertionError if the tip or the shard's end comes first."""
    args = {"StreamName": stream, "ShardId": shard, **_iterator_args(start)}
    iterator = kinesis.get_shard_iterator(**args)["ShardIterator"]
    out: list[dict] = []
    while iterator:
        page = kinesis.get_records(ShardIterator=iterator, Limit=1000)
        for rec in page["Records"]:
            if int(rec["SequenceNumber"]) > int(end_seq):
                return out
            out.append(rec)
        if out and out[-1]["SequenceNumber"] == end_seq:
            return out
        if not page["Records"] and page.get("MillisBehindLatest", 0) == 0:
            raise AssertionError(f"{stream}/{shard}: the tip came before {end_seq}")
        iterator = page.get("NextShardIterator")
    raise AssertionError(f"{stream}/{shard}: the shard ended before {end_seq}")
