"""Positions in a shard's log, offsets over many shards, and the exact ranges between them.

A position is a cut in one shard's log. It is written as a short string so the offset log
stays readable and canonical::

    TRIM_HORIZON
    AT_TIMESTAMP:2026-11-21T20:15:00.000000Z
    AT:49590338271490256608559692538361571095921575989136588898
    AFTER:49590338271490256608559692538361571095921575989136588898[:<subSequenceNumber>]
    SHARD_END

Sequence numbers stay strings (real ones have ~56 digits) and are only ever compared as
integers through :func:`seq_key`.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, NamedTuple

from kinesis_source.errors import PositionError

OFFSET_VERSION = 1

TRIM_HORIZON = "TRIM_HORIZON"
AT_TIMESTAMP = "AT_TIMESTAMP"
AT = "AT"
AFTER = "AFTER"
SHARD_END = "SHARD_END"

_SEQ_RE = re.compile(r"^[0-9]{1,128}$")




def check_seq(seq: str, what: str = "sequence number") -> str:
    """Return ``seq`` if it is a Kinesis sequence number (decimal digits), else raise."""
    if not isinstance(seq, str) or not _SEQ_RE.match(seq):
        raise PositionError(f"{what} {seq!r} is not a Kinesis sequence number (decimal digits)")
    return seq


def seq_key(seq: str) -> int:
    """Ordering key of a sequence number: its integer value (never compare the strings)."""
    return int(check_seq(seq))


def seq_max(a: str, b: str) -> str:
    """The later of two sequence numbers."""
    return a if seq_key(a) >= seq_key(b) else b


def parse_timestamp(text: str) -> datetime:
    """Parse an ISO-8601 timestamp; a value without a zone is taken as UTC."""
    raw = text.strip()
    if raw.endswith(("Z", "z")):
        raw = raw[:-1] + "+00:00"
    ts = datetime.fromisoformat(raw)
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=timezone.utc)
    return ts.astimezone(timezone.utc)


def format_timestamp(ts: datetime) -> str:
    """Canonical UTC form with microseconds, so equal instants give equal strings."""
    return ts.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, order=False)
class Position:
    """A cut in one shard's log: where reading starts, or where a batch ended."""

    kind: str
    seq: str | None = None
    sub_seq: int | None = None
    timestamp: datetime | None = None

    @staticmethod
    def trim_horizon() -> Position:
        """Before the oldest record still retained."""
        return Position(TRIM_HORIZON)

    @staticmethod
    def at_timestamp(ts: datetime) -> Position:
        """Before the first record that arrived at or after ``ts``."""
        return Position(AT_TIMESTAMP, timestamp=ts.astimezone(timezone.utc))

    @staticmethod
    def at(seq: str) -> Position:
        """Before the record with sequence number ``seq`` (it is included)."""
        return Position(AT, seq=check_seq(seq))

    @staticmethod
    def after(seq: str, sub_seq: int | None = None) -> Position:
        """After the record ``seq`` (or after its user record ``sub_seq`` when aggregated)."""
        return Position(AFTER, seq=check_seq(seq), sub_seq=sub_seq)

    @staticmethod
    def shard_end() -> Position:
        """After the last record of a closed shard."""
        return Position(SHARD_END)

    @property
    def is_shard_end(self) -> bool:
        """True when every record of the (closed) shard is before this position."""
        return self.kind == SHARD_END

    def to_str(self) -> str:
        """Canonical string form, as stored in offsets and checkpoints."""
        if self.kind in (TRIM_HORIZON, SHARD_END):
            return self.kind
        if self.kind == AT_TIMESTAMP:
            assert self.timestamp is not None
            return f"{AT_TIMESTAMP}:{format_timestamp(self.timestamp)}"
        if self.kind == AT:
            return f"{AT}:{self.seq}"
        if self.sub_seq is not None:
            return f"{AFTER}:{self.seq}:{self.sub_seq}"
        return f"{AFTER}:{self.seq}"

    @staticmethod
    def parse(text: str) -> Position:
        """Inverse of :meth:`to_str`; raises :class:`PositionError` naming the bad text."""
        if not isinstance(text, str):
            raise PositionError(f"position {text!r} is not a string")
        if text in (TRIM_HORIZON, SHARD_END):
            return Position(text)
        kind, _, rest = text.partition(":")
        try:
            if kind == AT_TIMESTAMP:
                return Position.at_timestamp(parse_timestamp(rest))
            if kind == AT:
                return Position.at(rest)
            if kind == AFTER:
                seq, _, sub = rest.partition(":")
                return Position.after(seq, int(sub) if sub else None)
        except (ValueError, PositionError) as exc:
            raise PositionError(f"position {text!r} is malformed: {exc}") from None
        raise PositionError(
            f"position {text!r} is not one of TRIM_HORIZON, AT_TIMESTAMP:<iso>, AT:<seq>, "
            "AFTER:<seq>, SHARD_END"
        )

    def iterator_args(self) -> dict[str, Any]:
        """Keyword arguments for ``GetShardIterator`` that start reading at this position.

        An ``AFTER`` inside an aggregated record starts at that record again (``AT``): the
        reader drops the user records up to ``sub_seq``.
        """
        if self.kind == TRIM_HORIZON:
            return {"ShardIteratorType": "TRIM_HORIZON"}
        if self.kind == AT_TIMESTAMP:
            return {"ShardIteratorType": "AT_TIMESTAMP", "Timestamp": self.timestamp}
        if self.kind == AT or (self.kind == AFTER and self.sub_seq is not None):
            return {"ShardIteratorType": "AT_SEQUENCE_NUMBER", "StartingSequenceNumber": self.seq}
        if self.kind == AFTER:
            return {"ShardIteratorType": "AFTER_SEQUENCE_NUMBER", "StartingSequenceNumber": self.seq}
        raise PositionError(f"no iterator starts at {self.to_str()}: the shard has ended")

    def __str__(self) -> str:
        return self.to_str()


class ShardId(NamedTuple):
    """One shard of one stream. Its text form ``<stream>/<shardId>`` is used only where it is
    serialized: offset keys, checkpoint items, logs and messages."""

    stream: str
    shard: str

    def __str__(self) -> str:
        return f"{self.stream}/{self.shard}"

    @staticmethod
    def parse(key: str) -> ShardId:
        """Inverse of ``str()``; raises :class:`PositionError` naming a malformed key. The
        shard id is what follows the last ``/`` (stream names have none)."""
        stream, sep, shard = key.rpartition("/")
        if not sep or not stream or not shard:
            raise PositionError(f"offset key {key!r} is not '<stream>/<shardId>'")
        return ShardId(stream, shard)


@dataclass(frozen=True)
class Offset:
    """Positions of every tracked shard; its JSON is keyed by each shard's ``<stream>/<shardId>``."""

    shards: Mapping[ShardId, Position]

    @functools.cached_property
    def streams(self) -> frozenset[str]:
        """The streams with at least one shard in the offset."""
        return frozenset(sid.stream for sid in self.shards)

    @functools.cached_property
    def _texts(self) -> dict[str, str]:
        """The JSON's ``shards``: keys sorted as text (as the JSON always was)."""
        keys = {str(sid): sid for sid in self.shards}
        return {k: self.shards[keys[k]].to_str() for k in sorted(keys)}

    def to_dict(self) -> dict[str, Any]:
        """The dict handed to Spark: keys sorted, so equal offsets serialize identically."""
        return {"shards": dict(self._texts), "version": OFFSET_VERSION}

    def with_changes(self, changes: Mapping[ShardId, Position]) -> Offset:
        """This offset with ``changes`` applied to shards it holds, made in time proportional
        to the changes where this offset was already serialized (a 1,000-shard offset of which
        a few shards moved is most batches' end)."""
        if not changes:
            return self
        if any(sid not in self.shards for sid in changes):
            return Offset({**self.shards, **changes})
        out = Offset({**self.shards, **changes})
        out.__dict__["streams"] = self.streams
        if "_texts" in self.__dict__:
            texts = dict(self._texts)
            for sid, pos in changes.items():
                texts[str(sid)] = pos.to_str()
            out.__dict__["_texts"] = texts
        return out

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, no spaces)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> Offset:
        """Parse an offset handed back by Spark; raises naming what is wrong."""
        if not isinstance(data, Mapping) or "shards" not in data:
            raise PositionError(f"offset {data!r} has no 'shards'")
        version = data.get("version")
        if version != OFFSET_VERSION:
            raise PositionError(
                f"offset version {version!r} is not supported (this kinesis-ddb writes version "
                f"{OFFSET_VERSION}); the checkpoint was written by another release"
            )
        shards = {ShardId.parse(key): Position.parse(text) for key, text in data["shards"].items()}
        return Offset(shards)

    @staticmethod
    def from_json(text: str) -> Offset:
        """Parse canonical (or any) JSON text of an offset."""
        return Offset.from_dict(json.loads(text))


@dataclass(frozen=True)
class ShardRange:
    """Records of one shard from ``start`` (an ``AFTER`` excludes its record, an ``AT``
    includes it) up to and including the record ``end_seq``, in sequence order."""

    stream: str
    shard_id: str
    start: Position
    end_seq: str

    @property
    def shard(self) -> ShardId:
        """The shard the range is of."""
        return ShardId(self.stream, self.shard_id)

    def covers(self, seq: str) -> bool:
        """True when ``seq`` is not past the range's end."""
        return seq_key(seq) <= seq_key(self.end_seq)

    def __str__(self) -> str:
        return f"{self.shard} ({self.start} .. {self.end_seq}]"
