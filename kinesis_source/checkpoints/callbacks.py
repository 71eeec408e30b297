"""Commit callbacks: what they receive, and loading one by dotted path (option ``onCommit``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kinesis_source.errors import OptionError


@dataclass(frozen=True)
class CommitInfo:
    """What a commit callback receives after a successful DynamoDB commit.

    ``positions`` maps ``(stream, shardId)`` to the sequence number committed (reading resumes
    after it); ``ended`` holds the shards committed at their end and still in the table (a
    finished shard leaves it once a child of it is committed).
    """

    application: str
    table: str
    epoch: int
    committed_at: datetime
    positions: Mapping[tuple[str, str], str]
    ended: frozenset


def load_callback(path: str) -> Callable[[CommitInfo], Any]:
    """Import ``package.module:function`` (the ``onCommit`` option)."""
    module_name, _, func_name = path.partition(":")
    try:
        func = getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as exc:
        raise OptionError(
            f"Option 'onCommit' = {path!r} cannot be loaded in Spark's driver-side Python "
            f"process: {exc}. The module must be importable there (installed, or on --py-files)"
        ) from None
    if not callable(func):
        raise OptionError(f"Option 'onCommit' = {path!r} is not a function")
    return func
