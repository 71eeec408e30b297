"""A shard's read bytes: the model of Kinesis' per-shard byte budget that paces every read.

Kinesis lets all the applications reading a shard take 2 MiB/s from it together, with a 10 MiB
burst: a bucket of 10 MiB refilled at 2 MiB/s, which a ``GetRecords`` response may overdraw, and
while it is empty every call on the shard is refused (``ProvisionedThroughputExceededException``).
Discovering that by throttles costs the reader seconds of backoff and, worse, the applications
it shares the shard with get refused while it overdraws.

So each reader keeps a model of the bucket (:class:`ShardBytes`): it spends the bytes of every
page it receives, asks ``GetRecords`` for a ``Limit`` that fits what the model says is left (by
the shard's record size, as seen so far), and waits exactly as long as the model needs for the
next page instead of a jittered exponential guess. The model knows this source's own reads; what
other applications read it learns from throttles: a refusal while the model had ``b`` bytes says
others took at least ``b`` since the model was last known right, so their estimated rate grows
by that much per second (and a quarter more; the first refusal, which refutes a bucket only
assumed full, sets it to an equal share, half the shard); the model keeps that
rate free, plus a second of it, so that their next call finds the bucket non-empty; and a
refused call is retried when the model, set to empty, has refilled. The estimate is held for
``OTHERS_HOLD_S`` after the refusal that set it, then fades (half-life ``OTHERS_HALF_LIFE_S``), so
bandwidth that others stop using comes back, at the cost of a throttle now and then while they
do not (about every two minutes beside a steady neighbour; fading at once, every 48 s); such a
refusal puts it back no lower than the last refusal set it, since the fading was what was
wrong.

An optional cap (``maxReadRatePerShard``) is a second bucket, of this source's reads alone:
two seconds deep, refilled at the cap: any span of ``T`` seconds reads at most ``T`` seconds of
the cap and two more. It starts full: a bucket that started empty made a query's first probe
wait two seconds (a record of unknown size is asked for as the largest one, 1 MiB, two seconds
of a 0.5 MiB/s cap) and did not stop the burst, which the bucket refills while a shard idles.

The model travels: the driver hands its state to each executor read (with the batch's ranges)
and takes back the state the read ended with (with the read's tip report), so probes and reads
of a shard, in whichever process, spend from one model. States hold wall-clock times (the
processes' monotonic clocks are not comparable).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MIB = 1024 * 1024
SHARD_BYTES_PER_S = 2 * MIB  # what Kinesis serves one shard per second, every reader together
SHARD_BURST_BYTES = 10 * MIB  # the bucket's depth (and the largest GetRecords response)
MAX_RECORD_BYTES = 1 * MIB  # a record's size while the shard's are not known yet
# Kept free of the model for clock differences and rounding between it and the server.
MARGIN_BYTES = 64 * 1024
# Others' estimated use kept in the bucket beyond their rate: their next call must find it
# non-empty even when it comes just after ours.
RESERVE_S = 1.0
OTHERS_HALF_LIFE_S = 300.0
OTHERS_HOLD_S = 60.0
# The first refusal sets others' estimate to at least this share of the shard: it refutes a
# model nobody verified yet (a bucket assumed full), which says nothing about a rate, only that
# someone else reads: until more refusals say otherwise, an equal share is assumed. (Learning
# it from the model's error instead took several refusals, and mistook this reader's own
# overdraft for others' reads: 1.78 MiB/s learnt of a 1 MiB/s neighbour in one benchmark run.)
LEARN_STEP_SHARE = 0.5
# Between two refusals the model's error is others' unseen reads: their estimate grows by that
# rate and this much more, so that it ends above their rate (the bucket then fills, and nobody
# is refused) rather than just below it (a refusal every time the difference adds up).
LEARN_OVERSHOOT = 1.25
# Others are never assumed to leave this source less than this share of the shard.
MIN_SHARE = 0.1
# A refusal's unexplained bytes are spread over at least this span when learning others' rate.
MIN_LEARN_SPAN_S = 1.0
# A lead page: the first page a large read takes from a full bucket is only the refill until its
# next call plus this allowance for building the large page after it (a 10 MB page takes moto
# 0.74 s). A server charges a response when it has built it, and while it builds a large one a
# full bucket's refill is lost (measured: a backlog's read took the first page's build time
# longer than the physical limit); a small lead page is built at once and takes the bucket that
# far below full, so the large page after it is built while the bucket refills.
LEAD_BUILD_S = 0.5
# "Full", for the lead page: within this share of a second's refill of the bucket's depth (a
# probe's small page may just have been taken).
FULL_SHARE = 0.25
# The cap's bucket: this many seconds of the cap. More than a call interval, so that it never
# fills up (and wastes its refill) while a read waits for its next call.
CAP_BURST_S = 2.0
# A count estimated from arrival times is asked for this much more: what an estimate misses
# costs the read a call, what it adds costs bytes (or, timing a read's last call, a little wait).
ESTIMATE_MARGIN = 0.05
# Record rates by arrival come from spans at least this long: a producer's batches make shorter
# ones coarse.
MIN_RATE_SPAN_S = 0.25


def records_between(first_at: float, last_at: float, rate: float) -> int:
    """How many records arrive from ``first_at`` to ``last_at`` (epoch seconds, the server's
    clock) at ``rate`` records a second, ``ESTIMATE_MARGIN`` more; at least one."""
    return max(1, math.ceil(max(0.0, last_at - first_at) * rate * (1 + ESTIMATE_MARGIN)))


def page_bytes(records: list[dict]) -> int:
    """What a page costs the shard's byte budget: its records' data and partition keys."""
    return sum(len(r["Data"]) + len((r.get("PartitionKey") or "").encode()) for r in records)


@dataclass(frozen=True)
class RateState:
    """A snapshot of one shard's model, as it travels between driver and executors."""

    level: float  # bytes the model says the shard's bucket holds at ``at``
    at: float  # epoch seconds
    others: float = 0.0  # bytes/s other applications are estimated to read, as of ``at``
    learned_at: float | None = None  # when a refusal last showed the bucket empty (epoch s; None: never)
    record_bytes: float | None = None  # the shard's records' mean size, as last read
    cap_level: float | None = None  # bytes left in the cap's bucket at ``at`` (None: full)
    taught: float = 0.0  # others' estimate as the last refusal set it, before it faded

    def to_json(self) -> dict[str, Any]:
        """The state's JSON object (tip reports carry it)."""
        return {"level": self.level, "at": self.at, "others": self.others,
                "learnedAt": self.learned_at, "recordBytes": self.record_bytes,
                "capLevel": self.cap_level, "taught": self.taught}

    @staticmethod
    def from_json(data: Any) -> RateState:
        """Parse a state; raises ``ValueError`` naming what is wrong."""
        if not isinstance(data, dict):
            raise ValueError("a read-rate state is not an object")
        out: dict[str, float | None] = {}
        for key in ("level", "at", "others", "learnedAt", "recordBytes", "capLevel", "taught"):
            value = data.get(key)
            if value is None and key not in ("level", "at"):
                out[key] = 0.0 if key in ("others", "taught") else None
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"{key} {value!r} is not a number")
            out[key] = float(value)
        if (out["others"] or 0.0) < 0 or (out["taught"] or 0.0) < 0 or (
            out["recordBytes"] is not None and out["recordBytes"] <= 0
        ):
            raise ValueError("others, taught and recordBytes must be positive")
        return RateState(out["level"], out["at"], out["others"] or 0.0,  # type: ignore[arg-type]
                         out["learnedAt"], out["recordBytes"], out["capLevel"], out["taught"] or 0.0)


class ShardBytes:
    """The model of one shard's byte bucket, spent by this source's reads (not thread-safe: one
    reader, or its owner's lock, at a time). Times are epoch seconds."""

    def __init__(self, cap: float | None, state: RateState | None, now: float, own_debt: bool = False) -> None:
        """``cap``: most bytes/s this source reads from the shard (None: no cap); ``state``: where
        the model stands (None: a shard nobody read lately, its bucket full); ``own_debt``: the
        state may miss this source's own reads (another attempt of the same read, whose bytes
        no model saw): the first refusal is taken as that debt, not as others' reads."""
        self.cap = cap
        if state is None:
            state = RateState(SHARD_BURST_BYTES, now)
        self._level = state.level
        self._at = min(state.at, now)
        self._others = state.others
        self._learned_at = state.learned_at  # None: no refusal has verified the model yet
        self._since = state.learned_at if state.learned_at is not None else self._at
        self.record_bytes = state.record_bytes
        # (a cap's level means nothing without a cap: a drained state sets it either way)
        self._cap_level = (self._cap_depth() if state.cap_level is None or cap is None
                           else state.cap_level)
        self.throttles = 0
        self._last_take = 0  # the bytes of this model's last page (a refusal may owe them)
        self._taught = state.taught  # others' estimate as the last refusal set it (before fading)
        self._own_debt = own_debt

    # -- the model -----------------------------------------------------------------------

    def _cap_depth(self) -> float:
        return math.inf if self.cap is None else self.cap * CAP_BURST_S

    def _others_at(self, now: float) -> float:
        """Others' estimate at ``now``: held for ``OTHERS_HOLD_S`` after the refusal that set it,
        fading after."""
        start = self._at if self._learned_at is None else max(self._at, self._learned_at + OTHERS_HOLD_S)
        return self._others * 0.5 ** (max(0.0, now - start) / OTHERS_HALF_LIFE_S)

    def _refill(self, now: float) -> None:
        if now <= self._at:
            return
        elapsed = now - self._at
        # others' rate fades over the span: its mean over the span is what they took
        others = self._others_at(now)
        mean_others = (self._others + others) / 2
        net = max(SHARD_BYTES_PER_S * MIN_SHARE, SHARD_BYTES_PER_S - mean_others)
        self._level = min(SHARD_BURST_BYTES, self._level + elapsed * net)
        if self.cap is not None:
            self._cap_level = min(self._cap_depth(), self._cap_level + elapsed * self.cap)
        self._others, self._at = others, now

    def _net_rate(self) -> float:
        return max(SHARD_BYTES_PER_S * MIN_SHARE, SHARD_BYTES_PER_S - self._others)

    def _reserve(self) -> float:
        return MARGIN_BYTES + self._others * RESERVE_S

    def available(self, now: float) -> float:
        """Bytes a call may take now without emptying the bucket (or passing the cap)."""
        self._refill(now)
        return min(self._level - self._reserve(), self._cap_level)

    def _most(self) -> float:
        """The most :meth:`available` can ever reach (a wait never asks for more)."""
        return min(SHARD_BURST_BYTES - self._reserve(), self._cap_depth())

    def wait_s(self, want: float, now: float) -> float:
        """Seconds until ``want`` bytes (at most what the buckets can hold) are available."""
        want = min(want, self._most())
        self._refill(now)
        shard = (want + self._reserve() - self._level) / self._net_rate()
        cap = 0.0 if self.cap is None else (want - self._cap_level) / self.cap
        return max(0.0, shard, cap)

    def spend(self, nbytes: int, records: int, now: float) -> None:
        """A response of ``records`` records and ``nbytes`` bytes arrived ``now``."""
        self._refill(now)
        self._level -= nbytes
        self._cap_level -= nbytes
        if records:
            self.record_bytes = nbytes / records
            self._last_take = nbytes

    def refused(self, now: float) -> None:
        """A call was refused for throughput: the bucket is empty. The bytes the model still
        had were read by others since it was last known right: learn their rate from them."""
        self._refill(now)
        if self._own_debt:
            # This source's own unseen reads emptied the bucket (a retried read's first
            # attempt): nothing to learn of others; wait for the refill like any refusal.
            self._own_debt = False
            self._level = min(self._level, 0.0) - self._last_take
            self._last_take = 0
            self.throttles += 1
            return
        if self._learned_at is None:
            # The model was never verified (a bucket assumed full), so what it still had is no
            # rate; but someone else reads: an equal share is assumed until refusals say more.
            others = max(self._others, SHARD_BYTES_PER_S * LEARN_STEP_SHARE)
        else:
            unexplained = max(0.0, self._level - MARGIN_BYTES)
            span = max(MIN_LEARN_SPAN_S, now - self._since)
            # not below what the last refusal taught: the fading since then was what was wrong
            others = max(self._others + LEARN_OVERSHOOT * unexplained / span, self._taught)
        self._others = self._taught = min(SHARD_BYTES_PER_S * (1 - MIN_SHARE), others)
        # Empty, and maybe overdrawn by this reader's last page: what it is short of is a debt,
        # not others' rate, and the next call waits it out instead of being refused again.
        self._level = min(self._level, 0.0) - self._last_take
        self._last_take = 0
        self._learned_at = self._since = now
        self.throttles += 1

    # -- what a call asks for ------------------------------------------------------------

    def record_size(self) -> float:
        """The size to plan a page with: the shard's mean record as last read, or the largest a
        record can be while no page was read (the first ``Limit`` then cannot overdraw)."""
        return self.record_bytes or MAX_RECORD_BYTES

    def want_bytes(self, records: int, interval_s: float) -> float:
        """Bytes worth a call for ``records`` records: all of them if they fit one refill of
        ``interval_s`` (the least time between two calls), else that refill."""
        per_call = max(MARGIN_BYTES, min(self._net_rate(), self.cap or math.inf) * interval_s)
        return min(records * self.record_size(), max(per_call, self.record_size()))

    def holds(self, nbytes: float) -> bool:
        """True when ``nbytes`` fit what one call may ever take (a full bucket, or the cap's)."""
        return nbytes <= self._most()

    def limit(self, records: int, now: float, lead_s: float | None = None) -> int:
        """``Limit`` for a call that wants ``records``: as many as the available bytes hold, at
        least one. ``lead_s``, for a read that needs more than a bucket: the time until its next
        call could come; from a full bucket the call then takes a lead page, that time's refill
        and ``LEAD_BUILD_S``'s (why: ``LEAD_BUILD_S``), when the records' size is known."""
        available = self.available(now)
        if self.record_bytes is None and self.cap is None and self._level >= SHARD_BURST_BYTES and not self._others:
            return records  # no response is larger than a full bucket that only we read
        if lead_s is not None and self._level >= SHARD_BURST_BYTES - self._net_rate() * FULL_SHARE:
            available = min(available, self._net_rate() * (lead_s + LEAD_BUILD_S))
        # (a hair over: a wait timed for exactly these bytes must not leave a record behind)
        fit = int(available / self.record_size() + 1e-9)
        return max(1, min(records, fit))

    def end_wait(self, left_bytes: float, wait_s: float, spacing_s: float, now: float) -> float:
        """The wait before a call of a read with ``left_bytes`` still to read, which would call
        in ``wait_s`` and then at most every ``spacing_s``: when the rest is there before the
        next call could come, wait for all of it and read it in one call; when it is there
        before the call after, call so that the next call comes when it is. Otherwise the read's
        last call would wait for the call spacing after its bytes were there (half a spacing on
        average)."""
        if left_bytes > self._most():
            return wait_s
        ready = self.wait_s(left_bytes, now)
        if ready <= wait_s or ready > wait_s + 2 * spacing_s:
            return wait_s
        return ready if ready <= wait_s + spacing_s else ready - spacing_s

    def state(self, now: float) -> RateState:
        """Where the model stands now, to hand on."""
        self._refill(now)
        cap_level = None if self.cap is None or self._cap_level >= self._cap_depth() else self._cap_level
        return RateState(self._level, self._at, self._others, self._learned_at, self.record_bytes, cap_level,
                         self._taught)


def retried_state(handed: RateState | None, range_bytes: float, now: float) -> RateState:
    """The state a read starts from when Spark runs it again (a retried task, a speculative
    copy): an earlier attempt may have read the range from the same ``handed`` state, and the
    shard's bucket holds no more than either bound below, so it starts from the lower:

    - the handed state less every byte of the range (``range_bytes``, when the records' size is
      known), refilled since: what the bucket holds if the earlier attempt read it all;
    - empty now: an attempt's own pages keep its model's level at or above zero, but for the
      first page from a full bucket whose records' size was not known.

    Never lower than one response's overdraw (``-SHARD_BURST_BYTES``), which the bucket never
    owes more than.

    What others read and the records' size are kept; the cap's bucket (if any) starts empty."""
    level = 0.0
    if handed is not None:
        less = RateState(handed.level - range_bytes, handed.at, handed.others, handed.learned_at,
                         handed.record_bytes, None, handed.taught)
        # (no lower than one response's overdraw: the bucket never owes more than that)
        level = max(-SHARD_BURST_BYTES, min(level, ShardBytes(None, less, now).state(now).level))
    if handed is None:
        return RateState(level, now, cap_level=0.0)
    return RateState(level, now, handed.others, handed.learned_at, handed.record_bytes, 0.0, handed.taught)
