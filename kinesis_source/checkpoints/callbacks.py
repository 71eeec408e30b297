"""Commit callbacks: what they receive, calling them, and loading one by dotted path (option
``onCommit``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Any

from kinesis_source.errors import CommitCallbackError
from kinesis_source.option_values import import_function
from kinesis_source.positions import AFTER, Position, ShardId

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommitInfo:
    """What a commit callback receives after a successful DynamoDB commit.

    ``positions`` maps each shard (a :class:`ShardId`, a ``(stream, shardId)`` tuple) to the
    sequence number committed (reading resumes after it); ``ended`` holds the shards committed
    at their end and still in the table (a finished shard leaves it once a child of it is
    committed).
    """

    application: str
    table: str
    epoch: int
    committed_at: datetime
    positions: Mapping[ShardId, str]
    ended: frozenset[ShardId]


def load_callback(path: str) -> Callable[[CommitInfo], Any]:
    """Import ``package.module:function`` (the ``onCommit`` option)."""
    return import_function(path, "onCommit", "Spark's driver-side Python process")


def commit_info(
    application: str, table: str, epoch: int, stored: Mapping[ShardId, Position]
) -> CommitInfo:
    """What the callbacks hear after a commit: every position the table now holds."""
    positions: dict[ShardId, str] = {}
    ended = set()
    for sid, pos in stored.items():
        if pos.kind == AFTER and pos.seq is not None:
            positions[sid] = pos.seq
        elif pos.is_shard_end:
            ended.add(sid)
    return CommitInfo(
        application=application,
        table=table,
        epoch=epoch,
        committed_at=datetime.now(timezone.utc),
        positions=MappingProxyType(positions),
        ended=frozenset(ended),
    )


def notify(callbacks: Iterable[Callable[[CommitInfo], Any]], info: CommitInfo, on_errors: str) -> None:
    """Call each callback; one that raises fails the query (``onCommitErrors=fail``) or is
    logged (``log``)."""
    for callback in callbacks:
        try:
            callback(info)
        except Exception as exc:
            name = getattr(callback, "__qualname__", repr(callback))
            if on_errors == "log":
                log.exception("commit callback %s raised; going on (onCommitErrors=log)", name)
                continue
            raise CommitCallbackError(
                f"Commit callback {name} raised {type(exc).__name__}: {exc} (the positions "
                "were committed to DynamoDB; set onCommitErrors=log to log and go on)"
            ) from exc
