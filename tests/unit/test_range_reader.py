"""Replaying one exact range, against an in-memory shard log."""

from __future__ import annotations

import pytest

from kinesis_source.kinesis import DataLossError, RangeIncompleteError, RangeReader
from kinesis_source.positions import Position, ShardRange
from tests.unit.fake_kinesis import FakeKinesis, FakeShard, log_of


def read(fake, rng, limit=7):
    reader = RangeReader(fake, rng, limit)
    pages = list(reader.pages())
    return [r["SequenceNumber"] for page in pages for r in page], pages


def test_reads_exactly_the_range_in_order_across_pages():
    recs = log_of(100)
    fake = FakeKinesis({"a": FakeShard(recs)})
    rng = ShardRange("s", "a", Position.after(recs[9][0]), recs[59][0])
    seqs, pages = read(fake, rng, limit=7)
    assert seqs == [s for s, _ in recs[10:60]]
    assert all(len(p) <= 7 for p in pages)


def test_at_position_includes_its_record_and_trim_horizon_starts_at_the_oldest():
    recs = log_of(20)
    fake = FakeKinesis({"a": FakeShard(recs)})
    assert read(fake, ShardRange("s", "a", Position.at(recs[3][0]), recs[5][0]))[0] == [
        s for s, _ in recs[3:6]
    ]
    assert read(fake, ShardRange("s", "a", Position.trim_horizon(), recs[2][0]))[0] == [
        s for s, _ in recs[:3]
    ]


def test_expired_iterator_is_re_derived_after_the_last_record_read():
    recs = log_of(50)
    fake = FakeKinesis({"a": FakeShard(recs)})
    reader = RangeReader(fake, ShardRange("s", "a", Position.trim_horizon(), recs[-1][0]), 10)
    pages = reader.pages()
    got = [r["SequenceNumber"] for r in next(pages)]
    fake.expire_next = 2  # two expiries in a row, then it works
    for page in pages:
        got += [r["SequenceNumber"] for r in page]
    assert got == [s for s, _ in recs]  # no gap, no duplicate
    assert fake.calls.count("GetShardIterator") == 3


def test_range_whose_end_is_never_reached_fails_naming_it():
    recs = log_of(10)
    fake = FakeKinesis({"a": FakeShard(recs)})
    missing = str(int(recs[-1][0]) + 1000)
    rng = ShardRange("s", "a", Position.trim_horizon(), missing)
    with pytest.raises(RangeIncompleteError) as err:
        read(fake, rng)
    message = str(err.value)
    assert "s/a" in message and missing in message and recs[-1][0] in message


def test_closed_shard_that_ends_before_the_range_fails():
    recs = log_of(10)
    fake = FakeKinesis({"a": FakeShard(recs, closed=True)})
    rng = ShardRange("s", "a", Position.trim_horizon(), str(int(recs[-1][0]) + 1))
    with pytest.raises(RangeIncompleteError, match="the shard ended"):
        read(fake, rng)


def test_missing_shard_names_the_stream():
    fake = FakeKinesis({"a": FakeShard(log_of(3))})
    with pytest.raises(Exception, match="Kinesis stream 's' was not found"):
        read(fake, ShardRange("s", "zz", Position.trim_horizon(), "1"))


def test_trimmed_range_start_fails_or_goes_on():
    recs = log_of(100)
    fake = FakeKinesis({"a": FakeShard(recs[30:])})  # the first 30 were trimmed
    rng = ShardRange("s", "a", Position.after(recs[5][0]), recs[50][0])
    with pytest.raises(DataLossError) as err:
        read(fake, rng)
    assert f"after position AFTER:{recs[5][0]}" in str(err.value)
    assert f"the oldest record left is {recs[30][0]}" in str(err.value)
    seqs, _ = read_lenient(fake, rng)
    assert seqs == [s for s, _ in recs[30:51]]


def test_start_record_is_read_once_to_check_it_and_not_returned():
    recs = log_of(20)
    fake = FakeKinesis({"a": FakeShard(recs)})
    seqs, _ = read(fake, ShardRange("s", "a", Position.after(recs[4][0]), recs[9][0]))
    assert seqs == [s for s, _ in recs[5:10]]
    assert fake.served[0] == recs[4][0]


def read_lenient(fake, rng):
    pages = list(RangeReader(fake, rng, 7, fail_on_data_loss=False).pages())
    return [r["SequenceNumber"] for page in pages for r in page], pages
