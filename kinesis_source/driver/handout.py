"""Handing a batch's ranges to the executors that read them, within each shard's budgets.

Two questions, both answered from the shards' records (``driver/shards.py``):

- ``latestOffset`` asks whether a shard's new records can go into this batch (:meth:`HandOut.held`):
  not when its executor read could not start now (its share of the call budget is spent, or its
  byte model holds less than a page), so they wait for a later batch instead of a task that
  sleeps (and a batch that lasts as long);
- planning the batch's partitions asks what each read gets (:meth:`HandOut.hand_over`): the
  records the driver already holds (a range carried whole needs no call), the iterator a probe
  or report left at its start, the wall-clock time its first calls are booked for, its size,
  its byte model; while executors read a shard and will report, the driver does not probe it.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from kinesis_source.aws.subscribe import DRIVER_GAP_S
from kinesis_source.driver.available_now import Target
from kinesis_source.driver.budget import GET_RECORDS, GET_SHARD_ITERATOR, ByteBudget, CallBudget
from kinesis_source.driver.probe import TailProber
from kinesis_source.driver.shards import ShardStates
from kinesis_source.driver.tips import TipTable
from kinesis_source.options import SourceOptions
from kinesis_source.positions import Position, ShardId, ShardRange
from kinesis_source.read_rate import RateState
from kinesis_source.tip_reports import ReportAddress

if TYPE_CHECKING:
    from kinesis_source.driver.feeds import Feeds

log = logging.getLogger(__name__)

# The longest the driver holds its probes of a shard that executors read and will report on.
# The batch's end releases them (Spark asks for the next end only then; a report that has not
# come will not), so this is a fallback only. Until then a probe would find nothing the report
# does not bring, and would spend the call budget the read uses: after its second page a read
# spaces its pages by the shard's whole budget.
READ_HOLD_S = 3600.0
# Reads without a report (and none ever received) before the driver warns that executors
# cannot reach its listener.
MISSING_WARN = 3
# A shard's new records join a batch only if its executor read can start within this.
HOLD_SLACK_S = 0.05

# What an executor read gets from planning: the iterator and first record the probe found at
# the range's start (or None), the wall-clock time its first call is booked for, how many
# records the range holds (None: not known), the shard's byte model (None: the read makes no
# call), when the range's end record arrived (epoch seconds; None: not known, or the size is),
# the range's first records, which the driver already read (driver/carried.py), and the
# wall-clock time the shard's budget has room for the read's second call (None: not held).
Booking = tuple[tuple[str, str | None] | None, float, int | None, RateState | None, float | None,
                tuple[dict, ...], float | None]


class HandOut:
    """Books executor reads in the shards' budgets; counts what it handed out."""

    def __init__(self, opts: SourceOptions, shards: ShardStates, budget: CallBudget, byte_budget: ByteBudget,
                 tips: TipTable, prober: TailProber) -> None:
        self._opts = opts
        self._shards = shards
        self._budget = budget
        self._byte_budget = byte_budget
        self._tips = tips
        self._prober = prober
        self.booked = 0  # executor reads booked
        self.missing = 0  # booked reads whose report had not come when the shard was booked again
        self.carried_ranges = self.carried_records = 0  # ranges (and records) executors got whole

    def held(self, sid: ShardId, start: Position) -> bool:
        """True when an executor read of ``sid`` from ``start`` could not start now (its share
        of the call budget is spent: ``GetRecords``, and ``GetShardIterator`` when no probe left
        an iterator there; or the shard's byte model holds less than a page is worth): its new
        records wait for a later batch (and its probes with them: ``TipTable.hold``, which the
        caller applies on the loop). Reads the shard's record only: Spark's thread asks too."""
        if self._opts.consumer_mode == "efo":
            state = self._shards.get(sid)
            if state is None:
                return False
            with self._shards.lock:  # (the run grows on the loop)
                view = state.view
                feed = state.feed
                if feed is not None and view is not None and view.run is not None and view.run.starts(start):
                    # the driver's subscription holds the range's first records (paused or not):
                    # the rest are on their way (a probe's tip before it began), and the range
                    # goes whole
                    return not view.carries(start)
            # Subscriptions do not spend the polling budget, but Kinesis refuses a shard's next
            # one within 5 s of the last: the range waits here instead of in a task retrying
            # refused calls (and the shard's probes with it, until its range is handed out).
            return time.time() < state.subscribed_at + DRIVER_GAP_S
        if self._tips.carries(sid, start):
            return False  # the range goes to its executor whole: no call to wait for
        now = time.monotonic()
        free = self._budget.free_at(sid, GET_RECORDS, now=now)
        if self._prober.opener(sid, start) is None:
            free = max(free, self._budget.free_at(sid, GET_SHARD_ITERATOR, now=now))
        bytes_wait = self._byte_budget.wait_s(sid, self._opts.executor_page_interval_s)
        return free > now + HOLD_SLACK_S or bytes_wait > HOLD_SLACK_S

    def hand_over_held(self, ranges: list[ShardRange], address: ReportAddress | None,
                       feeds: Feeds) -> dict[ShardId, Booking]:
        """Fan-out with the driver's subscriptions: each range whose records the shard's run
        holds goes whole in its partition (no call); any other is read by its executor's own
        subscription, and the driver subscribes again after it (``driver/feeds.py``)."""
        out: dict[ShardId, Booking] = {}
        subscribing = []
        for rng in ranges:
            carried = self._tips.carry(rng.shard, rng.start, rng.end_seq)
            self._tips.hold_all((rng.shard,), False)  # its records wait no longer
            if carried is not None and carried[1]:
                out[rng.shard] = (None, 0.0, None, None, None, carried[0], None)
                self.carried_ranges += 1
                self.carried_records += len(carried[0])
                feeds.taken(rng.shard)
            else:
                subscribing.append(rng)
        self.subscribing(subscribing, address)
        for rng in subscribing:
            feeds.handed(rng.shard, rng.end_seq)
        return out

    def subscribing(self, ranges: list[ShardRange], address: ReportAddress | None) -> None:
        """Fan-out reads of ``ranges`` subscribe after now (their reports bring the actual
        times); subscriptions do not spend the polling budget."""
        # Unreported until their reports come, or (none asked) the batch is over: the driver's
        # next subscription must not take a shard over from its executor's.
        self._tips.reading([r.shard for r in ranges], time.monotonic() + READ_HOLD_S if address is not None else None)
        wall = time.time()
        for rng in ranges:
            state = self._shards.state(rng.shard)
            state.subscribed_at = max(state.subscribed_at, wall)

    def hand_over(self, ranges: list[ShardRange], address: ReportAddress | None,
                  target: Target | None) -> dict[ShardId, Booking]:
        """Each polling read's :data:`Booking`; the shards read by executors that will report
        are not probed until then."""
        tips = self._tips
        out: dict[ShardId, Booking] = {}
        reading = []
        now, wall = time.monotonic(), time.time()
        for rng in ranges:
            carried = tips.carry(rng.shard, rng.start, rng.end_seq)
            tips.hold_all((rng.shard,), False)
            if carried is not None and carried[1]:
                # every record of the range is in the partition: the read makes no call, sends no
                # report, and the driver's probes go on finding the shard's next records
                out[rng.shard] = (None, 0.0, None, None, None, carried[0], None)
                self.carried_ranges += 1
                self.carried_records += len(carried[0])
                continue
            reading.append(rng.shard)
            out[rng.shard] = self._book(rng, carried, address, target, now, wall)
        if address is not None:
            tips.reading(reading, time.monotonic() + READ_HOLD_S)
        return out

    def _book(self, rng: ShardRange, carried: tuple[tuple[dict, ...], bool, str | None] | None,
              address: ReportAddress | None, target: Target | None, now: float, wall: float) -> Booking:
        tips = self._tips
        prefix: tuple[dict, ...] = ()
        opener = self._prober.opener(rng.shard, rng.start)
        if carried is not None:
            prefix = carried[0]
            opener = (carried[2], None) if carried[2] is not None else None
        state = self._shards.state(rng.shard)
        if state.booking is not None and address is not None:
            self._report_missing(rng.shard, address)
        at, calls = self._budget.book_read(rng.shard, opener is None, now)
        state.booking = (rng.end_seq, calls)
        self.booked += 1
        # The driver's probes of the shard stop while it is read (the report resumes them):
        # after its first call the read has the whole budget, once the probes before it have
        # left the window. (Asked from now, not from the booking, which may lie ahead: a time
        # before the read's first call is raised by the read's own spacing.)
        second = None
        if address is not None:
            second = wall + (self._budget.free_at(rng.shard, GET_RECORDS, now=now) - now)
        records = tips.read_size(rng.shard, rng.start, rng.end_seq)
        tips.handed(rng.shard, rng.start, rng.end_seq)
        end_at = tips.arrival(rng.shard, rng.end_seq) if records is None else None
        if end_at is None and records is None and target is not None:
            end_at = target.arrival(rng.shard, rng.end_seq)
        rate = self._byte_budget.hand_out(rng.shard, records - len(prefix) if records else records)
        return (opener, wall + (at - now), records, rate, end_at, prefix, second)

    def _report_missing(self, shard: ShardId, address: ReportAddress) -> None:
        """The shard's last read was booked, and its report has not come by its next batch
        (batches run one after another, and a read reports before its task ends)."""
        self.missing += 1
        if self.missing == MISSING_WARN and not self._tips.reports:
            log.warning("%d executor reads sent no tip report to the driver at %s (shard %s the "
                        "last), and none ever arrived: executors cannot reach that address, and "
                        "the driver probes every shard itself. Set option tipReportHost to the "
                        "driver's address that executors reach (spark.driver.host), or "
                        "tipReports=false", self.missing, address, shard)
