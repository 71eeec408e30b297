"""How Kinesis' answers are parsed: epoch-float timestamps, and ``GetRecords`` pages without
botocore's walk of every record.

botocore turns a JSON answer into its output shape by walking the parsed JSON member by member
and calling a handler for each value. For a ``GetRecords`` page that walk is per record and per
field, in Python: on a page of 10,000 records of 1 KB it took 35 of the 83 ms its parsing took
(``benchmarks/read_path.py``), holding the GIL that a task's reader threads share. A page's
shape is flat and fixed (four strings or numbers and one base64 blob per record), so
:class:`PageParser` decodes it directly and leaves every other answer, and any page it does not
recognise, to botocore. Enhanced fan-out events hold the same records and are decoded the same way.
"""

from __future__ import annotations

import binascii
from typing import Any

from botocore.parsers import EventStreamJSONParser, JSONParser, ResponseParserFactory


def epoch_seconds(value: Any) -> float:
    """Timestamp parser for Kinesis responses: epoch seconds as a float.

    botocore's default builds a timezone-aware datetime per record, which was two thirds of
    the parsing time of a GetRecords page (benchmarks/read_path.py). Kinesis sends epoch
    numbers; anything else goes through botocore's own parser.
    """
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        from botocore.utils import parse_timestamp

        return parse_timestamp(value).timestamp()


# Response parser settings of the Kinesis clients (only: STS and DynamoDB keep botocore's).
KINESIS_PARSER_DEFAULTS = {"timestamp_parser": epoch_seconds}

# The shapes decoded in one pass, and their members: a GetRecords page and an enhanced fan-out
# event (SubscribeToShard's), which hold the same records.
_PAGES = {
    "GetRecordsOutput": ("Records", "NextShardIterator", "MillisBehindLatest", "ChildShards"),
    "SubscribeToShardEvent": ("Records", "ContinuationSequenceNumber", "MillisBehindLatest", "ChildShards"),
}
_RECORD_MEMBERS = frozenset(("SequenceNumber", "ApproximateArrivalTimestamp", "Data", "PartitionKey", "EncryptionType"))


class _OnePass:
    """What :class:`PageParser` and its event parser share: pages and events of records are
    decoded in one pass (the same output as botocore's walk: blobs decoded, timestamps as the
    timestamp parser makes them, members that are absent or null left out); any other
    structure, and one whose records are not of the expected form, is botocore's."""

    _timestamp_parser: Any

    def _handle_structure(self, shape: Any, value: Any) -> Any:
        members = _PAGES.get(shape.name)
        if members is None or not isinstance(value, dict) or not _plain(value.get("Records")):
            return super()._handle_structure(shape, value)  # type: ignore[misc]
        out = {key: value[key] for key in members if value.get(key) is not None}
        a2b, timestamp = binascii.a2b_base64, self._timestamp_parser
        for record in out.get("Records", ()):
            # (a bad blob or timestamp raises here as it does in botocore's walk)
            record["Data"] = a2b(record["Data"])
            arrived = record.get("ApproximateArrivalTimestamp")
            if arrived is not None and arrived.__class__ is not float:
                record["ApproximateArrivalTimestamp"] = timestamp(arrived)
        if "ChildShards" in out:  # (a closed shard's last page: rare, and small)
            out["ChildShards"] = self._parse_shape(shape.members["ChildShards"], out["ChildShards"])  # type: ignore[attr-defined]
        return out


def _plain(records: Any) -> bool:
    """True when ``records`` (a page's, as parsed JSON) is absent, or a list of records with
    only the members botocore knows, none null, each with its data."""
    if records is None:
        return True
    if not isinstance(records, list):
        return False
    try:
        return all(not (r.keys() - _RECORD_MEMBERS) and None not in r.values() and "Data" in r for r in records)
    except AttributeError:  # (a record that is not an object)
        return False


class _EventParser(_OnePass, EventStreamJSONParser):
    """botocore's parser of enhanced fan-out events, with :class:`_OnePass`."""


class PageParser(_OnePass, JSONParser):
    """botocore's JSON parser, but a ``GetRecords`` page (and, through its event parser, an
    enhanced fan-out event) is decoded in one pass over its records."""

    EVENT_STREAM_PARSER_CLS = _EventParser


class KinesisParserFactory(ResponseParserFactory):
    """The parser factory of the source's synchronous Kinesis clients: :class:`PageParser` for
    the JSON protocol, with :data:`KINESIS_PARSER_DEFAULTS`."""

    def __init__(self) -> None:
        super().__init__()
        self.set_parser_defaults(**KINESIS_PARSER_DEFAULTS)

    def create_parser(self, protocol_name: str) -> Any:
        if protocol_name == "json":
            return PageParser(**self._defaults)
        return super().create_parser(protocol_name)
