"""The parsers of option values: each checks one option's text and, when it is bad, says
what the rule is. ``options.py`` declares every option with one of these."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlparse

from kinesis_source.errors import OptionError, PositionError
from kinesis_source.positions import Position, check_seq, parse_timestamp

_STREAM_NAME_RE = re.compile(r"^[a-zA-Z0-9_.-]{1,128}$")


def int_in(lo: int, hi: int | None = None) -> Callable[[str], int]:
    rule = f"an integer from {lo} to {hi}" if hi is not None else f"an integer >= {lo}"

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise ValueError(f"must be {rule}") from None
        if value < lo or (hi is not None and value > hi):
            raise ValueError(f"must be {rule}")
        return value

    return parse


_BYTE_UNITS = {"": 1, "B": 1, "KB": 1000, "MB": 1000**2, "KIB": 1024, "MIB": 1024**2}


def byte_rate_in(lo: float, hi: float) -> Callable[[str], float]:
    """Bytes per second in ``(lo, hi]``: a number, optionally with a unit (``KiB``, ``MiB``,
    ``KB``, ``MB``; ``/s`` may follow)."""
    top = f"{hi / 1024**2:g}MiB" if hi >= 1024**2 else f"{hi:g}"
    rule = (f"bytes per second greater than {lo:g} and at most {top} (a number, or with a unit: "
            "512KiB, 0.5MiB, 1MB)")

    def parse(text: str) -> float:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*(/s)?\s*", text)
        unit = match.group(2).upper() if match else ""
        if match is None or unit not in _BYTE_UNITS:
            raise ValueError(f"must be {rule}")
        value = float(match.group(1)) * _BYTE_UNITS[unit]
        if not lo < value <= hi:
            raise ValueError(f"must be {rule}")
        return value

    return parse


def float_in(lo: float, hi: float) -> Callable[[str], float]:
    """A number in ``(lo, hi]``."""
    rule = f"a number greater than {lo:g} and at most {hi:g}"

    def parse(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise ValueError(f"must be {rule}") from None
        if not lo < value <= hi:
            raise ValueError(f"must be {rule}")
        return value

    return parse


def parse_non_empty(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text.strip()


def parse_stream_names(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(","))
    for name in names:
        if not _STREAM_NAME_RE.match(name):
            raise ValueError(
                "must be a comma-separated list of Kinesis stream names "
                "(1-128 characters of a-z, A-Z, 0-9, '_', '.', '-')"
            )
    if len(set(names)) != len(names):
        raise ValueError("names a stream twice")
    return names


def parse_stream_arns(text: str) -> tuple[str, ...]:
    """Comma-separated stream ARNs; their streams' names must differ (a name is the key)."""
    from kinesis_source.aws.streams import StreamArn

    arns = tuple(StreamArn.parse(t) for t in text.split(","))
    names = [a.name for a in arns]
    if len(set(names)) != len(names):
        raise ValueError(
            "names two streams of the same name (in two accounts or regions): the name keys "
            "offsets and checkpoints, so read them in two queries with two applicationNames"
        )
    regions = {a.region for a in arns}
    if len(regions) > 1:
        raise ValueError(
            f"names streams in several regions ({', '.join(sorted(regions))}): one query reads "
            "one region"
        )
    return tuple(a.arn for a in arns)


_APP_RE = re.compile(r"^[a-zA-Z0-9_.-]{1,128}$")


_TABLE_RE = re.compile(r"^[a-zA-Z0-9_.-]{3,255}$")


_CALLBACK_RE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")


def parse_app_name(text: str) -> str:
    if not _APP_RE.match(text.strip()):
        raise ValueError("must be 1-128 characters of a-z, A-Z, 0-9, '_', '.', '-'")
    return text.strip()


def parse_table_name(text: str) -> str:
    if not _TABLE_RE.match(text.strip()):
        raise ValueError("must be a DynamoDB table name: 3-255 characters of a-z, A-Z, 0-9, '_', '.', '-'")
    return text.strip()


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise ValueError("must be true or false")
    return value == "true"


def import_function(path: str, option: str, where: str) -> Callable[..., Any]:
    """The function a ``package.module:function`` option names, imported in this process
    (``where`` says which, for the error when it cannot be)."""
    import importlib

    module_name, _, func_name = path.partition(":")
    try:
        func = getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as exc:
        raise OptionError(
            f"Option '{option}' = {path!r} cannot be loaded in {where}: {exc}. The module must be "
            "importable there (installed, or on --py-files)"
        ) from None
    if not callable(func):
        raise OptionError(f"Option '{option}' = {path!r} is not a function")
    return func


def parse_callback_path(text: str) -> str:
    if not _CALLBACK_RE.match(text.strip()):
        raise ValueError("must be a dotted path 'package.module:function'")
    return text.strip()


def one_of(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return value

    return parse


_ROLE_RE = re.compile(r"^arn:aws[a-zA-Z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}$")


_SESSION_RE = re.compile(r"^[\w+=,.@-]{2,64}$")


def parse_role_arn(text: str) -> str:
    if not _ROLE_RE.match(text.strip()):
        raise ValueError("must be an IAM role ARN, e.g. arn:aws:iam::123456789012:role/reader")
    return text.strip()


def parse_session_name(text: str) -> str:
    if not _SESSION_RE.match(text.strip()):
        raise ValueError("must be 2-64 characters of letters, digits and +=,.@_-")
    return text.strip()


def parse_host(text: str) -> str:
    host = text.strip()
    if not host or any(c in host for c in " /@") or host.count(":") == 1:
        raise ValueError("must be a host name or IP address without scheme or port, e.g. 10.0.0.5")
    return host


def parse_url(text: str) -> str:
    parsed = urlparse(text.strip())
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError("must be an http:// or https:// URL, e.g. http://127.0.0.1:4566")
    return text.strip()


@dataclass(frozen=True)
class InitialPosition:
    """Where a query with no checkpoint starts, per shard.

    ``kind`` is TRIM_HORIZON, LATEST, AT_TIMESTAMP or SHARDS. For SHARDS, ``shards`` maps a
    shard id (or ``<stream>/<shardId>``) to a position string or ``LATEST``; shards it does not
    name start at TRIM_HORIZON.
    """

    kind: str
    timestamp: datetime | None = None
    shards: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        if self.kind == "AT_TIMESTAMP":
            return f"AT_TIMESTAMP:{self.timestamp.isoformat()}"  # type: ignore[union-attr]
        if self.kind == "SHARDS":
            return json.dumps(dict(self.shards), sort_keys=True)
        return self.kind


_INITIAL_RULE = (
    "must be TRIM_HORIZON, LATEST, AT_TIMESTAMP:<ISO-8601 timestamp> or a JSON object "
    '{"<shardId>": "<sequenceNumber>"}'
)


def _initial_position(text: str) -> InitialPosition:
    raw = text.strip()
    upper = raw.upper()
    if upper in ("TRIM_HORIZON", "LATEST"):
        return InitialPosition(upper)
    if upper == "EARLIEST":  # the AWS connector's, kinesis-sql's and Databricks' alias
        raise ValueError("is what other connectors call TRIM_HORIZON: write TRIM_HORIZON")
    if upper.startswith("AT_TIMESTAMP:"):
        try:
            return InitialPosition("AT_TIMESTAMP", timestamp=parse_timestamp(raw[13:]))
        except ValueError:
            raise ValueError(
                f"has a timestamp that is not ISO-8601 (e.g. AT_TIMESTAMP:2026-01-31T12:00:00Z); "
                f"it {_INITIAL_RULE}"
            ) from None
    if raw.startswith("{"):
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"is not valid JSON ({exc.msg}); it {_INITIAL_RULE}") from None
        if not isinstance(data, dict) or not data:
            raise ValueError(f"must be a non-empty JSON object; it {_INITIAL_RULE}")
        shards = []
        for key, value in sorted(data.items()):
            shards.append((key, shard_start(key, value)))
        return InitialPosition("SHARDS", shards=tuple(shards))
    raise ValueError(_INITIAL_RULE)


def parse_initial_position(text: str) -> InitialPosition:
    """Parse an ``initialPosition`` value (also the spec stored by ``checkpoints reset``)."""
    try:
        return _initial_position(text)
    except ValueError as exc:
        raise OptionError(f"Option 'initialPosition' = {text!r} is invalid: {exc}") from None


def shard_start(key: str, value: Any) -> str:
    """Validate one entry of the per-shard JSON; a bare sequence number means AFTER it."""
    if not isinstance(value, str):
        raise ValueError(f"gives shard {key!r} the value {value!r}: use a string")
    if value.upper() == "LATEST":
        return "LATEST"
    try:
        check_seq(value)
        return Position.after(value).to_str()
    except PositionError:
        pass
    try:
        Position.parse(value)
    except PositionError:
        raise ValueError(
            f"gives shard {key!r} the value {value!r}: use a sequence number (reading starts "
            "after it), TRIM_HORIZON, LATEST, AT_TIMESTAMP:<iso>, AT:<seq> or AFTER:<seq>"
        ) from None
    return value
