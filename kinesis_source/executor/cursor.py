"""Where the read of one exact range stands: the opening check, the resume position, the cut
at the range's end and the incompleteness rule, once for both readers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from kinesis_source.aws.kinesis import arrival_seconds
from kinesis_source.errors import (
    RangeIncompleteError,
    ShardNotFoundError,
    report_data_loss,
    report_shard_gone,
)
from kinesis_source.positions import AFTER, AT, Position, ShardRange, seq_key
from kinesis_source.read_rate import RateState
from kinesis_source.tip_reports import (
    CARRIED_BYTES_PER_SHARD,
    MAX_ITERATOR_CHARS,
    TipReport,
    call_record,
    carried_size,
)


def opening_position(start: Position) -> Position:
    """Where to open an iterator to read after ``start`` *and* see that its record is still
    there: ``AFTER:s`` opens at ``AT:s`` (one extra record), so a trimmed ``s`` shows."""
    if start.kind == AFTER:
        return Position.at(start.seq)  # type: ignore[arg-type]
    return start


def check_opening(records: list[dict], start: Position) -> tuple[list[dict], str | None]:
    """The records of the first page after ``start`` (read from :func:`opening_position`),
    and, if ``start``'s record is gone, the sequence number the read landed on instead."""
    if start.kind not in (AT, AFTER) or not records:
        return records, None
    first = records[0]["SequenceNumber"]
    if first != start.seq:
        return records, first  # landed past the position: its record was trimmed
    if start.kind == AFTER and start.sub_seq is None:
        return records[1:], None
    return records, None


def data_bytes(records: list[dict]) -> int:
    """The data bytes of Kinesis records (what reads and tip reports count)."""
    return sum(len(rec["Data"]) for rec in records)


class RangeCursor:
    """Where the read of one exact range stands; the one template both readers (polling and
    fan-out) follow, so the opening check, the resume position, the cut at the end and the
    incompleteness rule live once.

    Every new iterator or subscription opens at :meth:`opening`: one record *before* the
    position (``AT:s`` for ``AFTER:s``), so :meth:`take` can check that the record is still
    there. A read that landed past it lost records (trimmed by retention): that is reported,
    never skipped silently, whether at the range's start or when resuming after an expiry or a
    subscription's end. The position moves to after each record read, the dropped check record
    included, so a resume never emits a record twice.
    """

    def __init__(self, rng: ShardRange, fail_on_data_loss: bool, mode: str = "") -> None:
        self.range = rng
        self.position = rng.start
        self.last_seq: str | None = None  # the last record read (yielded or dropped as check)
        self._end = seq_key(rng.end_seq)
        self._fail_on_data_loss = fail_on_data_loss
        self._unchecked = False
        self._mode = mode
        self.read = 0  # records of the range read so far
        self.past = 0  # records read after the range's end (in the page that completed it)
        self.past_records: list[dict] = []  # those records
        self.read_bytes = 0  # data bytes of every record received
        self.extra_bytes = 0  # of them, outside the range: past its end, opening checks

    @property
    def unchecked(self) -> bool:
        """True when the next page starts with the opening's check record (read, not emitted)."""
        return self._unchecked

    def opening(self) -> Position:
        """Where the next iterator or subscription opens; its first records get checked."""
        self._unchecked = True
        return opening_position(self.position)

    def refused(self) -> Position:
        """The server refused :meth:`opening` (the position is older than the retention):
        report the loss, and go on from the oldest record left."""
        self._lost(None)
        self._unchecked = False
        self.position = Position.trim_horizon()
        return self.position

    def take(self, raw: list[dict], received: bool = True) -> tuple[list[dict], bool]:
        """The records of one page (or event) that belong to the range, in order, and whether
        the range is complete with them (``received`` false: records the driver carried to
        the read, which it did not receive from Kinesis)."""
        records = raw
        if self._unchecked and raw:
            self._unchecked = False
            records, landed = check_opening(raw, self.position)
            if landed is not None:
                self._lost(landed)
        if len(records) < len(raw):  # the check record was dropped: it counts as read
            self._advance(raw[0]["SequenceNumber"])
        done = False
        if not records or seq_key(records[-1]["SequenceNumber"]) <= self._end:
            out = records  # (a page's records are in order: the whole page is in the range)
        else:
            out = []
            for rec in records:
                if seq_key(rec["SequenceNumber"]) > self._end:
                    done = True
                    break
                out.append(rec)
        if out:
            self._advance(out[-1]["SequenceNumber"])
            done = done or seq_key(out[-1]["SequenceNumber"]) == self._end
        self.read += len(out)
        if done:
            self.past_records = records[len(out):]
            self.past = len(self.past_records)
        if received:
            got = data_bytes(raw)
            self.read_bytes += got
            self.extra_bytes += 0 if out is raw else got - data_bytes(out)
        return out, done

    def _advance(self, seq: str) -> None:
        self.last_seq = seq
        self.position = Position.after(seq)

    def _lost(self, landed: str | None) -> None:
        rng = self.range
        report_data_loss(rng.stream, rng.shard_id, self.position, landed, self._fail_on_data_loss)

    def incomplete(self, shard_ended: bool) -> RangeIncompleteError:
        """The error for reaching the shard's end or tip before the planned end, naming which
        of the causes applies."""
        rng, how = self.range, f" ({self._mode})" if self._mode else ""
        if self.last_seq is None:
            why = (
                "found no record at or after the range's start: every record from there on is "
                "gone (trimmed by the stream's retention), or the stream was deleted and "
                "re-created under the same name"
            )
        elif shard_ended:
            why = (
                f"reached the end of the closed shard (the shard ended) at its last record "
                f"{self.last_seq}, before the planned end: the stream was deleted and "
                "re-created under the same name since the batch was planned, or the offset "
                "belongs to another stream"
            )
        else:
            why = (
                f"reached the shard's tip, its newest record being {self.last_seq}, before the "
                "planned end: the stream was deleted and re-created under the same name since "
                "the batch was planned (its sequence numbers restart), or the offset belongs to "
                "another stream"
            )
        return RangeIncompleteError(
            f"Cannot complete range {rng}{how}: the read {why}. Spark's checkpoint cannot be "
            "replayed against this stream: run `kinesis-ddb checkpoints reset` and start with "
            "a new checkpointLocation."
        )


@dataclass(frozen=True)
class RawPage:
    """One page as a reader received it: its records, whether the shard ended with it, and
    whether the server said nothing newer was there (``MillisBehindLatest`` 0)."""

    records: list[dict]
    shard_ended: bool = False
    at_tip: bool = False
    behind_ms: int = 0  # MillisBehindLatest of the page (or event)
    next_iterator: str | None = None  # polling: reads on after the page's last record
    carried: bool = False  # records the driver carried to the read (no call received them)


class RangeReaderBase:
    """The one template of reading an exact range: the cursor checks openings, resumes, cuts
    at the end and decides incompleteness; a mode (polling, fan-out) supplies only
    :meth:`_next_page`."""

    # Whether the driver carries the records a read saw past its range's end to the next range
    # (polling); a mode whose reports' records the driver would drop sends none.
    CARRIES = True

    def __init__(self, rng: ShardRange, fail_on_data_loss: bool, mode: str = "") -> None:
        self._range = rng
        self._fail_on_data_loss = fail_on_data_loss
        self._cursor = RangeCursor(rng, fail_on_data_loss, mode)
        self._last_page: RawPage | None = None  # the page that completed the range

    def tip_report(self) -> TipReport | None:
        """What the read saw at and past the range's end, for the driver's tip table; None
        before the range is complete."""
        page = self._last_page
        if page is None or not page.records or page.carried:
            return None  # (a range the driver carried whole: the driver knows all it holds)
        cursor = self._cursor
        record = page.records[-1]
        past = tuple(cursor.past_records)
        carried = past if past and self.CARRIES and carried_size(past) <= CARRIED_BYTES_PER_SHARD else None
        # bounded by construction: the listener refuses a whole message for one field too large
        iterator = page.next_iterator if page.next_iterator and len(page.next_iterator) <= MAX_ITERATOR_CHARS else None
        calls, made = call_record(self._reported_calls())
        return TipReport(
            self._range.shard, record["SequenceNumber"], page.behind_ms, iterator, calls,
            self._range.end_seq, cursor.past, cursor.read_bytes, cursor.extra_bytes, self._rate_state(),
            self._throttled(), self._subscribed(),
            seq_at=arrival_seconds(record) if "ApproximateArrivalTimestamp" in record else None,
            in_range=cursor.read, carried=carried, made=made,
        )

    def _subscribed(self) -> float | None:
        """When the read last subscribed to the shard (fan-out; wall clock), else None."""
        return None

    def _rate_state(self) -> RateState | None:
        """The shard's byte model as the read leaves it (modes that spend the shared budget)."""
        return None

    def _throttled(self) -> int:
        """The read's calls refused for throughput."""
        return 0

    def _reported_calls(self) -> dict[str, list[float]]:
        """The read's Kinesis calls that spend the shard's polling budget, by operation
        (epoch seconds)."""
        return {}

    def _next_page(self) -> RawPage | None:
        """The next page, or None when there is none to process yet (ask again)."""
        raise NotImplementedError

    def _close(self) -> None:
        """Release what the mode holds (a subscription)."""

    def _finish(self) -> None:
        """The read ended (complete or not): by default, release what the mode holds."""
        self._close()

    def pages(self) -> Iterator[list[dict]]:
        """Yield the range's records in order, a page at a time, and nothing past its end;
        raise :class:`RangeIncompleteError` if the shard ends or its tip is reached first. A
        shard the stream no longer has is data loss, as ``failOnDataLoss`` says."""
        cursor, rng = self._cursor, self._range
        try:
            while True:
                try:
                    page = self._next_page()
                except ShardNotFoundError:
                    page = _GONE  # reported outside the handler: no chained traceback
                if page is _GONE:
                    report_shard_gone(rng.stream, rng.shard_id, cursor.position, self._fail_on_data_loss)
                    return
                if page is None:
                    continue
                out, done = cursor.take(page.records, received=not page.carried)
                if done:
                    self._last_page = page
                if out:
                    yield out
                if done:
                    return
                if page.shard_ended or (page.at_tip and not page.records):
                    raise cursor.incomplete(page.shard_ended)
        finally:
            self._finish()


_GONE = RawPage([])
