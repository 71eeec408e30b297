"""KPL de-aggregation against aggregates encoded by aws-kinesis-agg."""

import hashlib
import logging
import random

import pytest

from kinesis_source import kpl
from kinesis_source.executor.arrow import to_record_batch, user_records
from kinesis_source.positions import Position, ShardRange
from tests.support.aggregates import (
    aggregate,
    corrupt_checksum,
    truncated_body,
    with_digest,
    wrong_digest,
)

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


def _bad_key_index(data):
    # one user record naming partition key 5 of an empty key table, under a valid MD5
    return with_digest(b"\x1a\x04\x08\x05\x1a\x00")


@pytest.mark.parametrize(
    "damage,reason",
    [
        (truncated_body, "runs past the end"),
        (_bad_key_index, "partition key index 5 outside the key table"),
    ],
)
def test_corrupt_aggregate_fails_naming_shard_and_sequence_number(damage, reason):
    _, data = aggregate(USERS)
    with pytest.raises(kpl.CorruptAggregateError) as err:
        kpl.expand([kinesis_record(damage(data), seq="4242")], "orders/shardId-000000000003")
    message = str(err.value)
    assert "orders/shardId-000000000003" in message and "4242" in message
    assert reason in message and "onCorruptAggregate=skip" in message


@pytest.mark.parametrize("on_corrupt", ["fail", "skip"])
def test_key_table_entry_that_is_no_utf8_is_a_corrupt_aggregate(on_corrupt):
    # key table ["\xff"], one user record with partition key 0
    data = with_digest(b"\x0a\x01\xff\x1a\x04\x08\x00\x1a\x00")
    if on_corrupt == "fail":
        with pytest.raises(kpl.CorruptAggregateError, match="non-UTF-8 key"):
            kpl.expand([kinesis_record(data)], "s/a")
    else:
        assert kpl.expand([kinesis_record(data)], "s/a", on_corrupt="skip") == ([], 1)


def test_corrupt_aggregate_skipped_and_counted():
    _, good = aggregate(USERS[:2])
    records = [kinesis_record(truncated_body(good), "1"), kinesis_record(good, "2"), kinesis_record(b"x", "3")]
    out, skipped = kpl.expand(records, "s/a", on_corrupt="skip")
    assert skipped == 1
    assert [r["SequenceNumber"] for r in out] == ["2", "2", "3"]


def _looks_like_an_aggregate():
    """Plain payloads that start with the magic but are not aggregates (no matching MD5)."""
    rnd = random.Random(14)
    _, good = aggregate(USERS)
    return {
        "random bytes": kpl.MAGIC + rnd.randbytes(300),
        "magic alone": kpl.MAGIC,
        "magic and a byte": kpl.MAGIC + b"\x00",
        "magic and a digest, no body": kpl.MAGIC + hashlib.md5(b"").digest(),
        "one body byte flipped": corrupt_checksum(good),
        "intact body, wrong digest": wrong_digest(good),
    }


@pytest.mark.parametrize("name", list(_looks_like_an_aggregate()))
@pytest.mark.parametrize("on_corrupt", ["fail", "skip"])
def test_record_starting_with_the_magic_without_its_md5_is_plain(name, on_corrupt):
    data = _looks_like_an_aggregate()[name]
    rec = kinesis_record(data, seq="7", key="pk")
    out, skipped = kpl.expand([kinesis_record(b"before", "6"), rec, kinesis_record(b"after", "8")], "s/a", on_corrupt)
    assert skipped == 0
    assert out[1] is rec and [r["Data"] for r in out] == [b"before", data, b"after"]
    assert not kpl.is_aggregate(data)
    rows = to_record_batch("s", "a", out).to_pylist()
    assert (rows[1]["data"], rows[1]["partitionKey"], rows[1]["subSequenceNumber"]) == (data, "pk", 0)


@pytest.mark.parametrize("name", list(_looks_like_an_aggregate()))
def test_count_user_records_agrees_that_it_is_one_plain_record(name):
    assert kpl.count_user_records(_looks_like_an_aggregate()[name]) == 1


def test_count_user_records_counts_an_aggregate_and_a_corrupt_one_as_one():
    _, good = aggregate(USERS)
    assert kpl.count_user_records(good) == len(USERS)
    assert kpl.count_user_records(with_digest(b"\x1a\x05\x08")) == 1


def test_decode_of_a_plain_record_is_no_corrupt_aggregate():
    with pytest.raises(ValueError, match="not a KPL aggregate") as err:
        kpl.decode(kpl.MAGIC + b"\x00")
    assert not isinstance(err.value, kpl.CorruptAggregateError)


UPPER_HALF = (2**127, 2**128 - 1)


def test_user_records_outside_the_shards_hash_range_are_dropped_by_explicit_hash_key():
    first, last = UPPER_HALF
    hash_keys = [first, first - 1, last, 0, first + 12345, 2**127 - 1, last - 1, 5]
    users = [(f"k{i}", f"d{i}".encode(), str(h)) for i, h in enumerate(hash_keys)]
    _, data = aggregate(users)
    out, _ = kpl.expand([kinesis_record(data, "100")], "s/a", hash_range=UPPER_HALF)
    inside = [i for i, h in enumerate(hash_keys) if first <= h <= last]
    assert inside == [0, 2, 4, 6]
    # kept records keep their index in the aggregate
    assert [(r["SubSequenceNumber"], r["PartitionKey"], r["Data"]) for r in out] == [
        (i, f"k{i}", f"d{i}".encode()) for i in inside
    ]


def test_user_records_without_explicit_hash_key_are_routed_by_the_md5_of_their_partition_key():
    keys = [f"customer-{i}" for i in range(40)]
    # the bound is checked independently of kpl: top bit of the MD5 set = upper half
    upper = [k for k in keys if hashlib.md5(k.encode()).digest()[0] & 0x80]
    assert 0 < len(upper) < len(keys)
    _, data = aggregate([(k, k.encode()) for k in keys])
    out, _ = kpl.expand([kinesis_record(data, "100")], "s/a", hash_range=UPPER_HALF)
    assert [r["PartitionKey"] for r in out] == upper
    assert [r["SubSequenceNumber"] for r in out] == [keys.index(k) for k in upper]


def test_explicit_hash_key_wins_over_the_partition_key():
    key = next(f"k{i}" for i in range(100) if not hashlib.md5(f"k{i}".encode()).digest()[0] & 0x80)
    _, data = aggregate([(key, b"routed-up", str(2**128 - 1)), (key, b"by-key")])
    out, _ = kpl.expand([kinesis_record(data)], "s/a", hash_range=UPPER_HALF)
    assert [r["Data"] for r in out] == [b"routed-up"]


def test_without_a_hash_range_nothing_is_dropped():
    users = [(f"k{i}", b"x", str(h)) for i, h in enumerate([0, 2**128 - 1, 2**127])]
    _, data = aggregate(users + [("pk", b"y")])
    out, _ = kpl.expand([kinesis_record(data)], "s/a")
    assert [r["SubSequenceNumber"] for r in out] == [0, 1, 2, 3]


def test_plain_records_are_never_filtered_by_hash_range():
    key = next(f"k{i}" for i in range(100) if not hashlib.md5(f"k{i}".encode()).digest()[0] & 0x80)
    plain = kinesis_record(b"plain", key=key)
    out, _ = kpl.expand([plain], "s/a", hash_range=UPPER_HALF)
    assert out == [plain]


def test_dropped_user_records_are_logged_with_the_shard_not_the_data(caplog):
    _, data = aggregate([("a", b"secret-in", str(2**128 - 1)), ("b", b"secret-out", "0")])
    with caplog.at_level(logging.DEBUG, logger="kinesis_source.kpl"):
        out, _ = kpl.expand([kinesis_record(data)], "orders/shardId-000000000007", hash_range=UPPER_HALF)
    assert [r["Data"] for r in out] == [b"secret-in"]
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "Dropped 1 user record" in text and "orders/shardId-000000000007" in text
    assert "secret" not in text


def test_explicit_hash_key_that_is_no_number_is_a_corrupt_aggregate():
    _, data = aggregate([("a", b"1", "not-a-number")])
    with pytest.raises(kpl.CorruptAggregateError, match="explicit hash key 0 is not a decimal"):
        kpl.expand([kinesis_record(data, "9")], "s/a", hash_range=UPPER_HALF)


def test_range_starting_inside_an_aggregate_drops_the_user_records_already_read():
    _, data = aggregate(USERS[:5])
    rng = ShardRange("s", "a", Position.after("100", 2), "101")
    out = user_records([kinesis_record(data, "100"), kinesis_record(b"next", "101")], rng, "fail")
    assert [(r["SequenceNumber"], r.get("SubSequenceNumber", 0)) for r in out] == [("100", 3), ("100", 4), ("101", 0)]


def test_user_records_filters_by_the_hash_range_it_is_given_after_a_start_inside_the_aggregate():
    users = [(f"k{i}", f"d{i}".encode(), str(h)) for i, h in enumerate([2**127, 0, 2**127 + 1, 1, 2**128 - 1])]
    _, data = aggregate(users)
    rng = ShardRange("s", "a", Position.after("100", 0), "100")
    out = user_records([kinesis_record(data, "100")], rng, "fail", hash_range=UPPER_HALF)
    assert [r["SubSequenceNumber"] for r in out] == [2, 4]
    assert [r["SubSequenceNumber"] for r in user_records([kinesis_record(data, "100")], rng, "fail")] == [1, 2, 3, 4]


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
