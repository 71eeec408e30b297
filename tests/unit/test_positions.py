"""Positions, offsets and sequence-number ordering."""

from datetime import datetime, timezone

import pytest

from kinesis_source.errors import PositionError
from kinesis_source.positions import (
    Offset,
    Position,
    ShardId,
    ShardRange,
    seq_key,
    seq_max,
)

# Real Kinesis sequence numbers have 56 digits.
SEQ_A = "49590338271490256608559692538361571095921575989136588898"
SEQ_B = "49590338271490256608559692540925702759324208523137515618"


def test_sequence_numbers_compare_as_integers_not_strings():
    assert "10" < "9"  # what a string comparison would conclude
    assert seq_key("10") > seq_key("9")
    assert seq_max("9", "10") == "10"
    assert seq_max("10", "9") == "10"


def test_56_digit_sequence_numbers_order():
    assert seq_key(SEQ_B) > seq_key(SEQ_A)
    assert seq_max(SEQ_A, SEQ_B) == SEQ_B
    shorter = "9" * 55
    assert seq_key(SEQ_A) > seq_key(shorter)  # longer number is larger though it starts with 4


def test_range_covers_uses_integer_order():
    rng = ShardRange("s", "shardId-0", Position.trim_horizon(), "10")
    assert rng.covers("9")
    assert rng.covers("10")
    assert not rng.covers("11")
    assert not rng.covers("100")


@pytest.mark.parametrize(
    "pos",
    [
        Position.trim_horizon(),
        Position.shard_end(),
        Position.at(SEQ_A),
        Position.after(SEQ_A),
        Position.after(SEQ_A, 3),
        Position.at_timestamp(datetime(2026, 1, 31, 12, 0, 0, 123456, tzinfo=timezone.utc)),
    ],
)
def test_position_round_trip(pos):
    assert Position.parse(pos.to_str()) == pos
    assert Position.parse(pos.to_str()).to_str() == pos.to_str()


def test_position_strings_are_readable():
    assert Position.after("12").to_str() == "AFTER:12"
    assert Position.after("12", 4).to_str() == "AFTER:12:4"
    ts = datetime(2026, 1, 31, 12, 0, tzinfo=timezone.utc)
    assert Position.at_timestamp(ts).to_str() == "AT_TIMESTAMP:2026-01-31T12:00:00.000000Z"


KINDS = "is not one of TRIM_HORIZON, AT_TIMESTAMP:<iso>, AT:<seq>, AFTER:<seq>, SHARD_END"
NOT_DIGITS = "is not a Kinesis sequence number (decimal digits)"


@pytest.mark.parametrize(
    "text, message",
    [
        ("", f"position '' {KINDS}"),
        ("LATEST", f"position 'LATEST' {KINDS}"),
        ("AFTER:", f"position 'AFTER:' is malformed: sequence number '' {NOT_DIGITS}"),
        ("AFTER:12a", f"position 'AFTER:12a' is malformed: sequence number '12a' {NOT_DIGITS}"),
        ("AT:-1", f"position 'AT:-1' is malformed: sequence number '-1' {NOT_DIGITS}"),
        ("AT_TIMESTAMP:x", "position 'AT_TIMESTAMP:x' is malformed: Invalid isoformat string: 'x'"),
        ("AFTER:12:x", "position 'AFTER:12:x' is malformed: invalid literal for int()"),
        (7, "position 7 is not a string"),
    ],
)
def test_bad_positions_are_rejected_with_the_text(text, message):
    """The whole message, quoting the text (the old check, ``str(text) in message``, held for
    "" whatever the message said)."""
    with pytest.raises(PositionError) as err:
        Position.parse(text)
    assert str(err.value).startswith(message), str(err.value)


def test_iterator_args():
    assert Position.trim_horizon().iterator_args() == {"ShardIteratorType": "TRIM_HORIZON"}
    assert Position.after("5").iterator_args() == {
        "ShardIteratorType": "AFTER_SEQUENCE_NUMBER",
        "StartingSequenceNumber": "5",
    }
    assert Position.at("5").iterator_args()["ShardIteratorType"] == "AT_SEQUENCE_NUMBER"
    # Inside an aggregated record: start at the record again and drop the user records read.
    assert Position.after("5", 2).iterator_args()["ShardIteratorType"] == "AT_SEQUENCE_NUMBER"
    with pytest.raises(PositionError):
        Position.shard_end().iterator_args()


def test_offset_json_is_canonical_and_round_trips():
    a = Offset({ShardId("s", "shardId-2"): Position.after(SEQ_B), ShardId("s", "shardId-1"): Position.after("9")})
    b = Offset({ShardId("s", "shardId-1"): Position.after("9"), ShardId("s", "shardId-2"): Position.after(SEQ_B)})
    assert a.to_json() == b.to_json()
    assert list(a.to_dict()["shards"]) == ["s/shardId-1", "s/shardId-2"]
    assert list(a.to_dict()) == sorted(a.to_dict())
    assert Offset.from_json(a.to_json()) == a
    assert Offset.from_dict(a.to_dict()).to_json() == a.to_json()


def test_offset_rejects_unknown_version_and_bad_keys():
    with pytest.raises(PositionError, match="version 99"):
        Offset.from_dict({"version": 99, "shards": {}})
    with pytest.raises(PositionError, match="no-slash"):
        Offset.from_dict({"version": 1, "shards": {"no-slash": "TRIM_HORIZON"}})
    with pytest.raises(PositionError, match="has no 'shards'"):
        Offset.from_dict({"version": 1})


def test_shard_id_text_round_trip_keeps_stream_names_with_dots():
    assert ShardId.parse(str(ShardId("my.stream-1", "shardId-000000000001"))) == (
        "my.stream-1",
        "shardId-000000000001",
    )


def test_shard_id_text_form_is_the_offset_key():
    sid = ShardId("orders", "shardId-000000000001")
    assert str(sid) == f"{sid}" == "orders/shardId-000000000001"
    stream, shard = sid  # still a (stream, shardId) tuple: callbacks unpack CommitInfo keys
    assert (stream, shard) == sid == ("orders", "shardId-000000000001")
    assert {("orders", "shardId-000000000001"): 1}[sid] == 1


@pytest.mark.parametrize("key", ["no-slash", "/shardId-1", "s/", ""])
def test_malformed_shard_keys_are_rejected_naming_the_key(key):
    with pytest.raises(PositionError) as err:
        ShardId.parse(key)
    assert str(err.value) == f"offset key {key!r} is not '<stream>/<shardId>'"


def test_offset_json_sorts_shards_by_their_text_not_their_tuple():
    """("a", "x") < ("a-b", "x") as tuples, but "a-b/x" < "a/x" as text: the JSON (which Spark
    compares as a string, and which checkpoints hold) keeps the text order it always had."""
    offset = Offset({ShardId("a", "x"): Position.after("1"), ShardId("a-b", "x"): Position.trim_horizon()})
    assert offset.to_json() == '{"shards":{"a-b/x":"TRIM_HORIZON","a/x":"AFTER:1"},"version":1}'
    assert list(offset.to_dict()["shards"]) == ["a-b/x", "a/x"]
    assert Offset.from_json(offset.to_json()) == offset
