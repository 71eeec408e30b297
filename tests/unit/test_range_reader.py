"""Replaying one exact range, against an in-memory shard log."""

from __future__ import annotations

import pytest

from kinesis_source.errors import DataLossError, RangeIncompleteError
from kinesis_source.executor.gate import PAGE_JITTER
from kinesis_source.executor.polling import RangeReader
from kinesis_source.positions import Position, ShardRange
from kinesis_source.read_rate import (
    LEAD_BUILD_S,
    LEARN_STEP_SHARE,
    MARGIN_BYTES,
    MIB,
    SHARD_BURST_BYTES,
    SHARD_BYTES_PER_S,
    RateState,
)
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


def test_missing_stream_names_the_option_to_check():
    fake = FakeKinesis({"a": FakeShard(log_of(3))})
    with pytest.raises(Exception, match="Kinesis stream 'other' was not found.*'streamName'"):
        read(fake, ShardRange("other", "a", Position.trim_horizon(), "1"))


def test_missing_shard_of_an_existing_stream_is_data_loss_as_failOnDataLoss_says():
    """Issue 14 item 8: a shard that expired after the batch was planned was reported as
    "stream not found" and failed the query whatever failOnDataLoss said, on every retry."""
    recs = log_of(3)
    fake = FakeKinesis({"a": FakeShard(recs)})
    rng = ShardRange("s", "zz", Position.after(recs[0][0]), recs[2][0])
    with pytest.raises(DataLossError) as err:
        read(fake, rng)
    assert "stream 's' no longer has shard 'zz'" in str(err.value)
    assert f"read only up to AFTER:{recs[0][0]}" in str(err.value)
    assert "failOnDataLoss=false" in str(err.value)
    assert read_lenient(fake, rng) == ([], [])


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


class ExpiringAfter(FakeKinesis):
    """Expires the iterator of the GetRecords call number ``n`` (1-based), once."""

    def __init__(self, shards, n):
        super().__init__(shards)
        self._n = n

    def get_records(self, ShardIterator, Limit):
        if self.calls.count("GetRecords") + 1 == self._n:
            self.expire_next = 1
        return super().get_records(ShardIterator, Limit)


def test_after_range_whose_first_page_holds_only_the_start_record_reads_on():
    """Issue 14 item 4: a same-millisecond burst (MillisBehindLatest 0 on every page) and
    one record per page: the first page holds only the dropped start record ``s``; that page
    is not empty, so it is not the tip (it raised RangeIncompleteError before)."""
    recs = log_of(10, spacing=0.0)
    fake = FakeKinesis({"a": FakeShard(recs)})
    seqs, _ = read(fake, ShardRange("s", "a", Position.after(recs[3][0]), recs[6][0]), limit=1)
    assert seqs == [s for s, _ in recs[4:7]]


def test_iterator_expiring_right_after_the_dropped_start_record_does_not_emit_it():
    """Issue 14 item 4: the iterator expires after the first page (only the start record
    ``s``, dropped); the resume must continue after ``s``, not re-open at ``AT:s`` and emit
    ``s`` (it did: a duplicate of the previous batch's last record)."""
    recs = log_of(10)
    fake = ExpiringAfter({"a": FakeShard(recs)}, n=2)
    seqs, _ = read(fake, ShardRange("s", "a", Position.after(recs[3][0]), recs[6][0]), limit=1)
    assert seqs == [s for s, _ in recs[4:7]]


def test_resume_that_lands_past_the_last_record_read_is_data_loss_not_a_silent_shift():
    """A resume after an expiry re-opens at the last record read and checks it is still
    there: records trimmed between two reads are reported, never skipped silently."""
    recs = log_of(30)
    shard = FakeShard(list(recs))
    fake = ExpiringAfter({"a": shard}, n=2)
    reader = RangeReader(fake, ShardRange("s", "a", Position.trim_horizon(), recs[-1][0]), 5)
    pages = reader.pages()
    first = next(pages)
    assert [r["SequenceNumber"] for r in first] == [s for s, _ in recs[:5]]
    del shard.records[:8]  # retention trims records 0-7 (3 of them unread) meanwhile
    with pytest.raises(DataLossError) as err:
        next(pages)
    assert f"after position AFTER:{recs[4][0]}" in str(err.value)
    assert f"the oldest record left is {recs[8][0]}" in str(err.value)


@pytest.mark.parametrize(
    "shard, end, cause",
    [
        (FakeShard(log_of(5), closed=True), "9" * 60, "the shard ended"),
        (FakeShard(log_of(5)), "9" * 60, "tip, its newest record"),
        (FakeShard([]), "9" * 60, "no record at or after the range's start"),
    ],
)
def test_incomplete_range_names_its_cause(shard, end, cause):
    fake = FakeKinesis({"a": shard})
    with pytest.raises(RangeIncompleteError, match=cause):
        read(fake, ShardRange("s", "a", Position.trim_horizon(), end))


def test_range_ends_compare_as_integers_across_digit_counts():
    """The fake's sequence numbers go from 9 to 10 digits and from 55 to 56 (see log_of), as
    string order and integer order disagree there: a range ending at a 10-digit number holds
    its 9-digit records, one ending at a 56-digit number its 55-digit ones. Mutants caught:
    ``RangeCursor.take`` comparing ``rec["SequenceNumber"] > self.range.end_seq`` as strings;
    ``seq_key`` returning the string itself."""
    seqs = [s for s, _ in log_of(20)]
    assert [len(s) for s in seqs] == [9] * 5 + [10] * 5 + [55] * 5 + [56] * 5
    fake = FakeKinesis({"a": FakeShard(log_of(20))})
    assert read(fake, ShardRange("s", "a", Position.trim_horizon(), seqs[6]))[0] == seqs[:7]
    assert read(fake, ShardRange("s", "a", Position.after(seqs[3]), seqs[16]))[0] == seqs[4:17]
    assert read(fake, ShardRange("s", "a", Position.at(seqs[12]), seqs[19]))[0] == seqs[12:]


def test_an_iterator_reported_after_the_start_record_is_read_on_without_a_new_one():
    """A previous read reported its page's NextShardIterator after record ``s``: the range from
    ``AFTER:s`` reads on with it (no GetShardIterator) when its first record lies after ``s``;
    an iterator that is not where it claims (its first record at or before ``s``) is dropped and
    the range opens anew, so no record is read twice or skipped."""
    recs = log_of(30)
    fake = FakeKinesis({"a": FakeShard(recs)})
    rng = ShardRange("s", "a", Position.after(recs[9][0]), recs[19][0])
    reader = RangeReader(fake, rng, 100, opener=("a|10|0", None))  # the fake's iterator after record 9
    seqs = [r["SequenceNumber"] for page in reader.pages() for r in page]
    assert seqs == [s for s, _ in recs[10:20]]
    assert reader.handed_over and "GetShardIterator" not in fake.calls
    fake.calls.clear()
    wrong = RangeReader(fake, rng, 100, opener=("a|5|0", None))  # claims after 9, is after 4
    seqs = [r["SequenceNumber"] for page in wrong.pages() for r in page]
    assert seqs == [s for s, _ in recs[10:20]]
    assert not wrong.handed_over and "GetShardIterator" in fake.calls


def test_a_range_of_known_size_is_read_with_what_it_holds():
    """With ``records`` known, the reader asks for the range's records (and the opening's check
    record), not ``maxRecordsPerFetch``: what lies past the end is the next batch's, which would
    read it again. Its report says what it read: the bytes, and of them outside the range."""
    recs = log_of(200)
    fake = FakeKinesis({"a": FakeShard(recs)})
    limits = fake.limits
    rng = ShardRange("s", "a", Position.after(recs[9][0]), recs[39][0])
    reader = RangeReader(fake, rng, 10000, records=30)
    seqs = [r["SequenceNumber"] for page in reader.pages() for r in page]
    assert seqs == [s for s, _ in recs[10:40]]
    assert limits == [30 + 1]
    tip = reader.tip_report()
    assert tip is not None and (tip.seq, tip.end, tip.past) == (recs[39][0], recs[39][0], 0)

    def size(records):  # the fake's payloads
        return sum(len(f"d{seq}".encode()) for seq, _ in records)

    assert (tip.read_bytes, tip.extra_bytes) == (size(recs[9:40]), size(recs[9:10]))  # the check record

    # Unknown size: maxRecordsPerFetch, and everything up to the tip is read past the end.
    limits.clear()
    reader = RangeReader(fake, rng, 10000)
    assert [r["SequenceNumber"] for page in reader.pages() for r in page] == seqs
    assert limits == [10000]
    tip = reader.tip_report()
    assert tip.past == 200 - 40 and tip.extra_bytes == size(recs[9:10]) + size(recs[40:])


def test_a_known_size_too_small_costs_a_call_never_a_record():
    recs = log_of(60)
    fake = FakeKinesis({"a": FakeShard(recs)})
    rng = ShardRange("s", "a", Position.after(recs[9][0]), recs[49][0])
    reader = RangeReader(fake, rng, 10000, records=5)  # wrong: the range holds 40
    assert [r["SequenceNumber"] for page in reader.pages() for r in page] == [s for s, _ in recs[10:50]]
    # past the estimate, on in steps that double what was read past it, not for maxRecordsPerFetch
    # (the last asks for 32 and gets the 13 the shard has: 3 in the range, 10 past its end)
    assert fake.limits == [5 + 1, 2, 2, 4, 8, 16, 32]
    assert reader.tip_report().past == 10


def test_a_throttled_call_is_tried_again_when_the_byte_model_says(monkeypatch):
    recs = log_of(30)
    fake = FakeKinesis({"a": FakeShard(recs)})
    waits: list[float] = []
    clock = [1000.0]

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock[0] += seconds

    monkeypatch.setattr("kinesis_source.executor.gate.time.sleep", sleep)
    monkeypatch.setattr("kinesis_source.executor.gate.time.time", lambda: clock[0])
    reader = RangeReader(fake, ShardRange("s", "a", Position.trim_horizon(), recs[-1][0]), 10000, attempts=3)
    fake.throttle_next = 1  # another application took the shard's bytes
    seqs = [r["SequenceNumber"] for page in reader.pages() for r in page]
    assert seqs == [s for s, _ in recs]
    # refused, then one record (its size unknown, planned as the largest a record can be), then
    # the rest at the size seen
    assert fake.limits[1:] == [1, 10000]
    # the refusal set the model to empty and taught it that others read half the shard
    # (the most one refusal teaches): the retry waited for a record's worth (its size still
    # unknown: the largest a record can be) and a second of theirs to refill at what they leave,
    # not for a backoff guess
    others = SHARD_BYTES_PER_S * LEARN_STEP_SHARE
    expected = (MIB + MARGIN_BYTES + others) / (SHARD_BYTES_PER_S - others)
    paced = [w for w in waits if w > 0]  # tenacity itself sleeps 0 between attempts
    assert paced == [pytest.approx(expected, rel=0.01)]
    assert reader.bytes.throttles == 1


def test_throttles_past_the_attempts_fail_the_read(monkeypatch):
    recs = log_of(5)
    fake = FakeKinesis({"a": FakeShard(recs)})
    monkeypatch.setattr("kinesis_source.executor.gate.time.sleep", lambda s: None)
    reader = RangeReader(fake, ShardRange("s", "a", Position.trim_horizon(), recs[-1][0]), 10000, attempts=3)
    fake.throttle_next = 3
    with pytest.raises(Exception, match="ProvisionedThroughputExceeded"):
        list(reader.pages())
    assert fake.calls.count("GetRecords") == 3


def _paced_read(monkeypatch, recs, size, end_at, level=0.0, records=None):
    """Read all of ``recs`` (``size`` bytes each) from a byte model at ``level`` (drained by
    default; the records' size known when it is full), on a fake clock; returns (the calls'
    Limits, when the last call came: seconds after the start)."""
    fake, reader = _paced_reader(monkeypatch, recs, size, end_at, level, records)
    return fake.limits, reader.call_times["GetRecords"][-1] - 1000.0


def _paced_reader(monkeypatch, recs, size, end_at, level=0.0, records=None, **kw):
    """:func:`_paced_read`'s read (``kw``: more of the reader's arguments); returns the fake
    server and the reader, its clock started at 1000."""
    fake = FakeKinesis({"a": FakeShard(recs, payloads={s: b"x" * size for s, _ in recs})})
    clock = [1000.0]

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    for name in ("time", "monotonic"):
        monkeypatch.setattr(f"kinesis_source.executor.polling.time.{name}", lambda: clock[0])
    monkeypatch.setattr("kinesis_source.executor.gate.time.sleep", sleep)
    monkeypatch.setattr("kinesis_source.executor.gate.random.random", lambda: 0.0)
    rng = ShardRange("s", "a", Position.trim_horizon(), recs[-1][0])
    rate = RateState(level, clock[0], record_bytes=size + 1 if level else None)
    kw.setdefault("page_interval_s", 0.5)
    reader = RangeReader(fake, rng, 10000, rate=rate, end_at=end_at, records=records, **kw)
    assert [r["SequenceNumber"] for page in reader.pages() for r in page] == [s for s, _ in recs]
    return fake, reader


def test_a_range_of_unknown_size_times_its_last_call_by_its_end_records_arrival(monkeypatch):
    """Issue 20: a catch-up's range has no size, and its reads are paced by the shard's byte
    budget. Without knowing what is left, the last call came when a full call's bytes had
    refilled, up to a call spacing after the rest was there. Knowing when the range's end record
    arrived, the read estimates the rest from its records' arrival rate and calls when it is
    there, in one call fewer."""
    recs, size = log_of(70, spacing=0.1), 60_000
    all_there = (70 * (size + 1) + MARGIN_BYTES) / SHARD_BYTES_PER_S  # drained bucket, 2 MiB/s
    blind_limits, blind_last = _paced_read(monkeypatch, recs, size, None)
    limits, last = _paced_read(monkeypatch, recs, size, recs[-1][1])
    assert len(limits) == len(blind_limits) - 1
    assert all_there <= last <= all_there + 0.1 < blind_last - 0.25
    # An estimate is only made from a span of arrivals: a bunched backlog reads as before.
    bunched = [(s, 5000.0) for s, _ in recs]
    assert _paced_read(monkeypatch, bunched, size, 5000.0) == (blind_limits, blind_last)
    # An end said to arrive later than it did costs a little wait, never a record.
    late_limits, late_last = _paced_read(monkeypatch, recs, size, recs[-1][1] + 0.3)
    assert late_last <= blind_last


def test_a_page_that_ends_inside_a_bunch_counts_the_rest_of_it_as_left(monkeypatch):
    """Records arrive in bunches (a PutRecords' records share one arrival, moto's 500 at a
    time). A page that ended inside one left the rest of it, which an estimate from arrival
    times after the page's last record does not count: the read's last call then came a
    spacing late (here 0.47 s after the rest was there, against 0.14 s)."""
    recs = [(s, 1_000_000.0 + (i // 10) * 0.1429) for i, (s, _) in enumerate(log_of(70))]
    size = 60_000
    all_there = (70 * (size + 1) + MARGIN_BYTES) / SHARD_BYTES_PER_S
    _, blind_last = _paced_read(monkeypatch, recs, size, None)
    _, last = _paced_read(monkeypatch, recs, size, recs[-1][1])
    assert all_there <= last <= all_there + 0.2 < blind_last


def test_only_a_read_of_more_than_a_bucket_leads_with_a_small_page(monkeypatch):
    """Issue 20: a large read's first page from a full bucket is a lead page (read_rate.py,
    ``LEAD_BUILD_S``), so the server builds the large page after it while the bucket refills. A
    read that fits one call takes it in one call: a lead page would cost it a second call a
    spacing later (measured when every read took one: batches five times as long)."""
    size, full = 100_000, float(SHARD_BURST_BYTES)
    lead_records = int(SHARD_BYTES_PER_S * (0.5 * (1 + PAGE_JITTER) + LEAD_BUILD_S) / (size + 1))
    recs = log_of(150, spacing=0.0)
    # a catch-up's range: its size unknown, nothing to estimate it from
    limits, _ = _paced_read(monkeypatch, recs, size, None, level=full)
    assert limits[0] == lead_records < 150
    # counted, more than a bucket holds: a lead page too
    limits, _ = _paced_read(monkeypatch, recs, size, None, level=full, records=150)
    assert limits[0] == lead_records
    # counted, within a bucket: the whole range in one call
    small = recs[:60]
    limits, _ = _paced_read(monkeypatch, small, size, None, level=full, records=60)
    assert len(limits) == 1 and limits[0] >= 60


def test_the_second_call_waits_for_the_drivers_probes_to_leave_the_window_not_a_share(monkeypatch):
    """The driver stops probing a shard while an executor reads it, so after its first call a
    read has the shard's whole call budget, except for probes just before it, which the driver
    knows: it hands the read the time its second call fits (``second_at``). Without it the
    second call waits the read's share's spacing (a probe may have come just before the first),
    and a large read's lead page is sized for that longer wait."""
    size, full = 100_000, float(SHARD_BURST_BYTES)
    recs = log_of(150, spacing=0.0)

    def read(**kw):
        fake, reader = _paced_reader(monkeypatch, recs, size, None, level=full, page_interval_s=1.0,
                                     held_interval_s=0.5, **kw)
        first, second = reader.call_times["GetRecords"][:2]
        return fake.limits[0], second - first

    def lead_records(wait_s):
        return int(SHARD_BYTES_PER_S * (wait_s + LEAD_BUILD_S) / (size + 1))

    # no word from the driver: a share's spacing (1 s), the lead page sized for 1 s and jitter
    limit, gap = read()
    assert gap == pytest.approx(1.0) and limit == lead_records(1.0 * (1 + PAGE_JITTER))
    # the probes before the read left the window long ago: the whole budget's spacing
    limit, gap = read(second_at=1000.2)
    assert gap == pytest.approx(0.5) and limit == lead_records(0.5 * (1 + PAGE_JITTER))
    # a probe just before the read: the second call waits for it to leave the window
    limit, gap = read(second_at=1000.8)
    assert gap == pytest.approx(0.8) and limit == lead_records(0.8)
    # a time far off (the driver's clock ahead of this host's) waits no longer than the share
    limit, gap = read(second_at=1060.0)
    assert gap == pytest.approx(1.0) and limit == lead_records(1.0)
    # without the driver's hold of its probes (no reports), the time is not used
    fake, reader = _paced_reader(monkeypatch, recs, size, None, level=full, page_interval_s=1.0,
                                 second_at=1000.2)
    first, second = reader.call_times["GetRecords"][:2]
    assert second - first == pytest.approx(1.0)


def test_what_is_left_is_estimated_at_the_rate_the_last_records_arrived(monkeypatch):
    """A producer's rate drifts (moto's puts slow down as a shard grows: its last records
    arrived at 60% of the rate of the whole backlog). What is left of a range lies right after
    the records read last, so it is estimated at their rate: at the whole read's rate the
    estimate ran 1.7-2x over, and the read's last call waited for bytes that were not there."""
    # arrivals as moto's: the first 7% of the records in 2.3% of the span, the last 27% in 33%
    recs = [(s, 1_000_000.0 + 2.0 * (i / 69) ** 1.4) for i, (s, _) in enumerate(log_of(70))]
    size = 60_000
    all_there = (70 * (size + 1) + MARGIN_BYTES) / SHARD_BYTES_PER_S
    _, last = _paced_read(monkeypatch, recs, size, recs[-1][1])
    assert all_there <= last <= all_there + 0.15
