"""Records the driver already holds, carried to the executor that reads their range.

What a read returns past a position is exactly the shard's records after it, in order: a probe
that reads on from its continuation, and an executor read that saw past its range's end (its
tip report brings those records), each hold the start of the next range. Read again by an
executor, those records would cost the shard's shared 2 MiB/s twice and the batch a
``GetRecords`` round trip. So the tip table keeps, per shard, one *run*: the records that follow
one record, contiguous, and the iterator that reads on after the last of them. A range that
starts at that record gets the run's records up to its end in its partition (no call at all),
or, when the range goes further, all of them and the iterator for the rest.

A run is only ever what one reader returned after a known record (or several such reads, each
going on where the last stopped), so a range built from it holds exactly the records a read of
the range would: replays from Spark's offset log still read Kinesis and get the same records.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from kinesis_source.aws.kinesis import HANDED_ITERATOR_TTL_S
from kinesis_source.positions import AFTER, Position, seq_key
from kinesis_source.read_rate import page_bytes

# Most bytes one shard's run holds on the driver (it goes out with the next batch's partition)...
RUN_MAX_BYTES = 256 * 1024
# ...and, over all the shards the driver tracks, about this many (at 1,000 shards, 32 KB each).
RUNS_MAX_BYTES = 32 << 20


def run_cap(shards: int) -> int:
    """Most bytes one shard's run may hold when the driver tracks ``shards`` shards."""
    return min(RUN_MAX_BYTES, RUNS_MAX_BYTES // max(1, shards))


@dataclass
class CarriedRun:
    """The records that follow record ``after`` in one shard, in order, and an iterator that
    reads on right after the last of them (None: not known), received at ``iterator_at``.

    With ``origin`` (a position without a record: ``TRIM_HORIZON``, ``AT_TIMESTAMP:...``), the
    records that a read opened there returned instead (``after`` is then empty): what the
    driver's fan-out subscription opened at a batch's start received (``driver/feeds.py``).
    """

    after: str
    records: list[dict]
    next_iterator: str | None
    size: int = field(default=0)
    iterator_at: float = field(default_factory=time.monotonic)
    origin: str | None = None

    def __post_init__(self) -> None:
        self.size = page_bytes(self.records)

    @property
    def last(self) -> str:
        """The run's last record (``after`` when it holds none)."""
        return self.records[-1]["SequenceNumber"] if self.records else self.after

    def starts(self, start: Position) -> bool:
        """True when a range from ``start`` begins where this run does."""
        if self.origin is not None:
            return start.to_str() == self.origin
        return start.kind == AFTER and start.sub_seq is None and start.seq == self.after

    def append(self, records: list[dict]) -> None:
        """Records that follow the last one, from the one reader that feeds the run (the
        driver's subscription of the shard): kept in place, not copied."""
        self.records.extend(records)
        self.size += page_bytes(records)

    def extended(self, after: str, records: list[dict], next_iterator: str | None, cap: int,
                 made: float | None = None) -> CarriedRun | None:
        """This run with ``records`` (which follow ``after``) added, when ``after`` is its last
        record and the whole fits ``cap`` bytes; else None. ``next_iterator`` was made at
        ``made`` (monotonic; None: now)."""
        if after != self.last or self.size + page_bytes(records) > cap:
            return None
        if not records and not next_iterator:
            return CarriedRun(self.after, self.records, self.next_iterator, iterator_at=self.iterator_at)
        return CarriedRun(self.after, self.records + records, next_iterator,
                          iterator_at=time.monotonic() if made is None else made)

    def take(self, end_seq: str) -> tuple[tuple[dict, ...], bool, str | None, CarriedRun | None]:
        """The run's records up to and including ``end_seq``; whether they reach it; the
        iterator reading on after them when they stop short (None: not known, or too old to
        hand to an executor); and the run left after ``end_seq`` (None when nothing is)."""
        end = seq_key(end_seq)
        cut = 0
        while cut < len(self.records) and seq_key(self.records[cut]["SequenceNumber"]) <= end:
            cut += 1
        taken = tuple(self.records[:cut])
        if cut and taken[-1]["SequenceNumber"] == end_seq:
            left = CarriedRun(end_seq, self.records[cut:], self.next_iterator, iterator_at=self.iterator_at)
            return taken, True, None, left
        if cut < len(self.records):
            # no record of the run is the end, yet some lie past it: the end is not a record
            # of this shard as the run saw it, so nothing is carried
            return (), False, None, None
        fresh = time.monotonic() - self.iterator_at <= HANDED_ITERATOR_TTL_S
        return taken, False, self.next_iterator if fresh else None, None
