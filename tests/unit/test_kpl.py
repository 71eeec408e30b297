"""KPL de-aggregation against aggregates encoded by aws-kinesis-agg."""

import pytest

from kinesis_source import kpl
from kinesis_source.positions import Position, ShardRange
from kinesis_source.records import user_records
from tests.support.aggregates import aggregate, corrupt_checksum, truncated_body

USERS = [(f"user-key-{i % 7}", f"payload-{i}".encode() * (i % 3 + 1)) for i in range(50)]


def kinesis_record(data, seq="100", key="agg"):
    return {"Data": data, "PartitionKey": key, "SequenceNumber": seq, "ApproximateArrivalTimestamp": 5.0}


def test_decode_returns_user_records_in_order_with_their_keys():
    _, data = aggregate(USERS)
    assert kpl.is_aggregate(data)
    assert [(k, d) for k, d, _ in kpl.decode(data)] == USERS


def test_expand_sets_sub_sequence_numbers_and_keeps_plain_records():
    _, data = aggregate(USERS[:3])
    plain = kinesis_record(b"plain", seq="99", key="p")
    out, skipped = kpl.expand([plain, kinesis_record(data, seq="100")], "s/shard-1")
    assert skipped == 0
    assert out[0] is plain
    assert [(r["PartitionKey"], r["Data"], r["SequenceNumber"], r["SubSequenceNumber"]) for r in out[1:]] == [
        (k, d, "100", i) for i, (k, d) in enumerate(USERS[:3])
    ]
    assert all(r["ApproximateArrivalTimestamp"] == 5.0 for r in out)


@pytest.mark.parametrize(
    "damage,reason", [(corrupt_checksum, "MD5 checksum mismatch"), (truncated_body, "runs past the end")]
)
def test_corrupt_aggregate_fails_naming_shard_and_sequence_number(damage, reason):
    _, data = aggregate(USERS)
    with pytest.raises(kpl.CorruptAggregateError) as err:
        kpl.expand([kinesis_record(damage(data), seq="4242")], "orders/shardId-000000000003")
    message = str(err.value)
    assert "orders/shardId-000000000003" in message and "4242" in message
    assert reason in message and "onCorruptAggregate=skip" in message


def test_corrupt_aggregate_skipped_and_counted():
    _, good = aggregate(USERS[:2])
    records = [kinesis_record(corrupt_checksum(good), "1"), kinesis_record(good, "2"), kinesis_record(b"x", "3")]
    out, skipped = kpl.expand(records, "s/a", on_corrupt="skip")
    assert skipped == 1
    assert [r["SequenceNumber"] for r in out] == ["2", "2", "3"]


def test_magic_alone_is_corrupt():
    with pytest.raises(kpl.CorruptAggregateError, match="shorter than magic"):
        kpl.decode(kpl.MAGIC + b"\x00")


def test_range_starting_inside_an_aggregate_drops_the_user_records_already_read():
    _, data = aggregate(USERS[:5])
    rng = ShardRange("s", "a", Position.after("100", 2), "101")
    out = user_records([kinesis_record(data, "100"), kinesis_record(b"next", "101")], rng, "fail")
    assert [(r["SequenceNumber"], r.get("SubSequenceNumber", 0)) for r in out] == [("100", 3), ("100", 4), ("101", 0)]


def test_our_encoder_is_read_by_aws_kinesis_agg_and_by_us():
    from aws_kinesis_agg.deaggregator import iter_deaggregate_records

    data = kpl.encode(USERS)
    record = {"Data": data, "PartitionKey": "x", "SequenceNumber": "1",
              "ApproximateArrivalTimestamp": __import__("datetime").datetime.now()}
    theirs = list(iter_deaggregate_records([record], data_format="Boto3"))
    # it hands data back base64-encoded, as Lambda does
    import base64

    assert [(r["kinesis"]["partitionKey"], base64.b64decode(r["kinesis"]["data"])) for r in theirs] == USERS
    assert [(k, d) for k, d, _ in kpl.decode(data)] == USERS
