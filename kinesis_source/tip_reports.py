"""Tips that executors report to the driver: what a read saw at and past its range's end.

The page an executor reads its range's end from usually holds more: the records that arrived
between planning and the read. They are the next batch's, so the executor tells the driver's tip
table the last record it saw, how far that page was behind the shard's newest record
(``MillisBehindLatest``) and, when polling, the page's ``NextShardIterator`` (the driver's next
probe of the shard goes on from it in one call); and how many records it saw past its range's
end (the next range, up to the reported record, holds that many: it is read with an exact
``Limit``) and the bytes it read, with the shard's byte model as the read left it. While a
shard is being read the driver does not probe it: the report arrives before the batch ends, so
the next ``latestOffset`` answers from it.

When the records past the end are few (``CARRIED_BYTES_PER_SHARD``, and
``CARRIED_BYTES_PER_MESSAGE`` over a task's shards) the report carries them (``carried``): they
are exactly the next range's records, so the driver hands them to its executor instead of
having them read again (``driver/carried.py``).

A report only ever names a record a read returned, so an end the driver plans from it is a
record that exists; a report that is lost, late or refused costs the driver a probe, never a
record. The wire is one TCP connection per task to a listener in the driver's helper: one line
of canonical JSON (the run's token and the tips), answered ``ok`` once the table applied it.

With fan-out, a read's subscription goes on after its range as the shard's *tip watch*
(``executor/watch.py``): its reports (``watch``) name the newest record pushed to it, at most
every ``WATCH_FLUSH_S`` and at least every ``WATCH_HEARTBEAT_S`` while events arrive. The driver
does not probe a watched shard until ``WATCH_LEASE_S`` after the last one, or until the watch
says it ended.
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from kinesis_source.positions import ShardId, check_seq
from kinesis_source.read_rate import RateState

MAX_MESSAGE_BYTES = 4 << 20  # a task's report: a line per shard is ~1 KB, with the iterator...
# ...and the records past a range's end, when they take this little of the line (carried_size)...
CARRIED_BYTES_PER_SHARD = 64 * 1024
CARRIED_BYTES_PER_MESSAGE = 1 << 20  # ...and this little over the task's shards
_RECORD_JSON_BYTES = 160  # a carried record's JSON besides its data and key: sequence number, arrival
MAX_ITERATOR_CHARS = 4096
CALL_OPS = ("GetRecords", "GetShardIterator")
MAX_CALLS = 10_000  # call times per operation in one report, at most (the listener's check)
# A read reports the times of its newest calls only (those that can still lie in a call window:
# a window holds at most ceil(rate) calls), and how many it made in all: a long catch-up's
# report stays small by construction.
REPORTED_CALLS = 100
# A task's reports go in messages of about this many bytes at most (each report is bounded:
# its iterator, call times and carried records), never in one line the listener refuses.
MESSAGE_BUDGET_BYTES = MAX_MESSAGE_BYTES // 2
WATCH_FLUSH_S = 0.2  # a process's watches report new tips together, this often at most
WATCH_HEARTBEAT_S = 1.0  # a live watch says so this often...
WATCH_SILENT_S = 10.0  # ...while its last event is this recent (Kinesis sends empty ones when idle)
# The driver leaves a watched shard alone this long after a report: a worker that died with its
# watches (Spark ended it, or does not reuse workers) costs the shard's tips this much at most.
WATCH_LEASE_S = 3 * WATCH_HEARTBEAT_S
WATCH_LIVE, WATCH_ENDED = "live", "ended"


@dataclass(frozen=True)
class TipReport:
    """The last record a read saw on one shard, and where reading on would continue."""

    shard: ShardId
    seq: str  # the last record the read returned: the range's end or past it
    behind_ms: int  # MillisBehindLatest of the page that held it: 0 = nothing newer was there
    iterator: str | None = None  # GetRecords from it reads on after ``seq`` (polling only)
    # When the read called Kinesis (epoch seconds, per operation): the driver's ledger of the
    # shard's call budget replaces the read's booking with them.
    calls: dict[str, list[float]] = field(default_factory=dict)
    end: str | None = None  # the range's end: ``past`` records lie between it and ``seq``
    past: int = 0  # records the read saw after the range's end, ``seq`` the last of them
    read_bytes: int = 0  # data bytes the read received
    extra_bytes: int = 0  # of them, bytes outside the range (past its end, the opening check)
    # the shard's byte model as the read left it (polling): the driver's model goes on from it
    rate: RateState | None = None
    throttled: int = 0  # the read's calls that the shard refused for throughput
    # fan-out: when the read last subscribed (epoch seconds); the shard's next subscription
    # is refused for 5 s after it
    subscribed_at: float | None = None
    # fan-out: sent by the subscription going on after the range (a tip watch), not by the read:
    # WATCH_LIVE while it goes on, WATCH_ENDED once it stopped
    watch: str | None = None
    # the arrival of ``seq`` (epoch seconds, the server's clock): with the probes' tips', the
    # driver estimates how many records a range between two of them holds
    seq_at: float | None = None
    in_range: int | None = None  # records the read returned from its range (polling)
    # the ``past`` records themselves, in order (``seq`` the last), when the report carries them
    carried: tuple[dict, ...] | None = None
    # how many calls the read made, per operation, when ``calls`` holds only the newest
    made: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The report's JSON object."""
        return {"shard": str(self.shard), "seq": self.seq, "behindMs": self.behind_ms,
                "iterator": self.iterator, "calls": self.calls, "end": self.end, "past": self.past,
                "readBytes": self.read_bytes, "extraBytes": self.extra_bytes,
                "rate": self.rate.to_json() if self.rate is not None else None,
                "throttled": self.throttled, "subscribedAt": self.subscribed_at,
                "watch": self.watch, "seqAt": self.seq_at, "inRange": self.in_range,
                "carried": records_to_json(self.carried) if self.carried is not None else None,
                "made": self.made}

    @staticmethod
    def from_json(data: Any) -> TipReport:
        """Parse one report; raises ``ValueError`` naming what is wrong."""
        if not isinstance(data, dict):
            raise ValueError("a tip report is not an object")
        behind, iterator = data.get("behindMs"), data.get("iterator")
        if not isinstance(behind, int) or isinstance(behind, bool) or behind < 0:
            raise ValueError(f"behindMs {behind!r} is not a count of milliseconds")
        if iterator is not None and (not isinstance(iterator, str) or len(iterator) > MAX_ITERATOR_CHARS):
            raise ValueError("iterator is not a shard iterator")
        seq = data.get("seq")
        if not isinstance(seq, str):
            raise ValueError(f"seq {seq!r} is not a sequence number")
        calls = data.get("calls") or {}
        if not isinstance(calls, dict) or any(
            op not in CALL_OPS or not isinstance(times, list) or len(times) > MAX_CALLS
            or not all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in times)
            for op, times in calls.items()
        ):
            raise ValueError("calls is not a list of call times per operation")
        made = data.get("made") or {}
        if not isinstance(made, dict) or any(
            op not in CALL_OPS or not isinstance(n, int) or isinstance(n, bool) or n < len(calls.get(op, []))
            for op, n in made.items()
        ):
            raise ValueError("made is not a count of calls per operation")
        counts = {key: data.get(key, 0) for key in ("past", "readBytes", "extraBytes", "throttled")}
        in_range = data.get("inRange")
        if in_range is not None:
            counts["inRange"] = in_range
        for key, value in counts.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{key} {value!r} is not a count")
        end = data.get("end")
        if end is not None and not isinstance(end, str):
            raise ValueError(f"end {end!r} is not a sequence number")
        subscribed, seq_at = data.get("subscribedAt"), data.get("seqAt")
        for key, value in (("subscribedAt", subscribed), ("seqAt", seq_at)):
            if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                      or not 0 <= value < 1e11):
                raise ValueError(f"{key} {value!r} is not a time")
        watch = data.get("watch")
        if watch not in (None, WATCH_LIVE, WATCH_ENDED):
            raise ValueError(f"watch {watch!r} is not {WATCH_LIVE!r} or {WATCH_ENDED!r}")
        shard = ShardId.parse(str(data.get("shard")))
        times = {op: [float(t) for t in ts] for op, ts in calls.items()}
        rate = RateState.from_json(data["rate"]) if data.get("rate") is not None else None
        carried = records_from_json(data["carried"]) if data.get("carried") is not None else None
        return TipReport(shard, check_seq(seq), behind, iterator, times,
                         check_seq(end) if end is not None else None,
                         counts["past"], counts["readBytes"], counts["extraBytes"], rate,
                         counts["throttled"], float(subscribed) if subscribed is not None else None,
                         watch, float(seq_at) if seq_at is not None else None, in_range, carried,
                         dict(made))


def records_to_json(records: tuple[dict, ...]) -> list[dict[str, Any]]:
    """Kinesis records as JSON: sequence number, data (base64), partition key, arrival."""
    out = []
    for r in records:
        at = r.get("ApproximateArrivalTimestamp")
        out.append({"seq": r["SequenceNumber"], "data": base64.b64encode(r["Data"]).decode("ascii"),
                    "key": r.get("PartitionKey"), "at": at.timestamp() if isinstance(at, datetime) else at})
    return out


def records_from_json(data: Any) -> tuple[dict, ...]:
    """Kinesis records from :func:`records_to_json`, as ``GetRecords`` gives them; raises
    ``ValueError`` naming what is wrong."""
    if not isinstance(data, list):
        raise ValueError("carried is not a list of records")
    out = []
    for item in data:
        if not isinstance(item, dict) or not isinstance(item.get("data"), str):
            raise ValueError("a carried record has no data")
        seq, key, at = item.get("seq"), item.get("key"), item.get("at")
        if not isinstance(seq, str):
            raise ValueError(f"a carried record's sequence number {seq!r} is not a string")
        if key is not None and not isinstance(key, str):
            raise ValueError(f"a carried record's partition key {key!r} is not a string")
        if at is not None and (not isinstance(at, (int, float)) or isinstance(at, bool) or not 0 <= at < 1e11):
            raise ValueError(f"a carried record's arrival {at!r} is not a time")
        try:
            body = base64.b64decode(item["data"], validate=True)
        except ValueError as exc:
            raise ValueError("a carried record's data is not base64") from exc
        record: dict[str, Any] = {"SequenceNumber": check_seq(seq), "Data": body}
        if key is not None:
            record["PartitionKey"] = key
        if at is not None:
            record["ApproximateArrivalTimestamp"] = datetime.fromtimestamp(at, tz=timezone.utc)
        out.append(record)
    return tuple(out)


def carried_size(records: list[dict] | tuple[dict, ...]) -> int:
    """At most how many bytes ``records`` take in a report's line: their data in base64, their
    partition keys as JSON escapes them (up to 6 bytes a character), and the other fields."""
    return sum((len(r["Data"]) + 2) // 3 * 4 + 6 * len(r.get("PartitionKey") or "") + _RECORD_JSON_BYTES
               for r in records)


def call_record(times: dict[str, list[float]]) -> tuple[dict[str, list[float]], dict[str, int]]:
    """A read's call times as its report carries them: the newest ``REPORTED_CALLS`` of each
    operation, and how many it made."""
    return ({op: ts[-REPORTED_CALLS:] for op, ts in times.items() if ts},
                {op: len(ts) for op, ts in times.items() if ts})


def messages(tips: list[TipReport]) -> list[list[TipReport]]:
    """A task's reports split into messages of at most ``MESSAGE_BUDGET_BYTES`` each (a report
    larger than that, which its bounds make impossible, goes alone)."""
    out: list[list[TipReport]] = []
    size = MESSAGE_BUDGET_BYTES
    for tip in tips:
        cost = len(json.dumps(tip.to_json(), separators=(",", ":"))) + 1
        if size + cost > MESSAGE_BUDGET_BYTES:
            out.append([])
            size = 0
        out[-1].append(tip)
        size += cost
    return out


def within_carry_budget(tips: list[TipReport]) -> list[TipReport]:
    """The task's reports with carried records dropped past ``CARRIED_BYTES_PER_MESSAGE`` of
    the line (in order: the first shards keep theirs), so that it stays under its limit."""
    left, out = CARRIED_BYTES_PER_MESSAGE, []
    for tip in tips:
        if tip.carried is not None:
            size = carried_size(tip.carried)
            if size > left:
                tip = replace(tip, carried=None)
            else:
                left -= size
        out.append(tip)
    return out


@dataclass(frozen=True)
class ReportAddress:
    """Where executors send their reports, and the run's token that the listener requires."""

    host: str
    port: int
    token: str

    def __repr__(self) -> str:
        return f"ReportAddress({self.host}:{self.port})"  # the token stays out of logs


def encode(token: str, tips: list[TipReport], now: float | None = None) -> bytes:
    """One report message: a line of canonical JSON, with the sender's clock when it was sent
    (``now``, epoch seconds: the receiver moves the tips' times to its own clock)."""
    body = {"token": token, "tips": [t.to_json() for t in tips], "sentAt": time.time() if now is None else now}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes, now: float | None = None) -> tuple[str, list[TipReport]]:
    """(token, tips) of one message, their times on the receiver's clock (``now`` when it
    arrived, epoch seconds); raises ``ValueError`` naming what is wrong."""
    body = json.loads(line)
    if not isinstance(body, dict) or not isinstance(body.get("token"), str):
        raise ValueError("a report message has no token")
    tips = body.get("tips")
    if not isinstance(tips, list):
        raise ValueError("a report message has no tips")
    sent = body.get("sentAt")
    if sent is not None and (not isinstance(sent, (int, float)) or isinstance(sent, bool) or not 0 < sent < 1e11):
        raise ValueError(f"sentAt {sent!r} is not a time")
    parsed = [TipReport.from_json(t) for t in tips]
    if sent is None:
        return body["token"], parsed
    # The sender's clock may be ahead or behind: its times move by the difference between the
    # two clocks as the message shows it (the transit adds a little, which only makes a byte
    # state as of a little earlier: never fuller than it was).
    shift = (time.time() if now is None else now) - float(sent)
    return body["token"], [_shifted(tip, shift) for tip in parsed]


def _shifted(tip: TipReport, shift: float) -> TipReport:
    """``tip`` with its sender-clock times (calls, byte state) moved by ``shift`` seconds. The
    arrival of its record is the server's clock and stays; so does its subscription's time,
    which names the subscription (a watch's reports are told apart by it, and each message's
    shift differs by its transit)."""
    rate = tip.rate
    if rate is not None:
        rate = replace(rate, at=rate.at + shift,
                       learned_at=rate.learned_at + shift if rate.learned_at is not None else None)
    return replace(tip, rate=rate, calls={op: [t + shift for t in times] for op, times in tip.calls.items()})
