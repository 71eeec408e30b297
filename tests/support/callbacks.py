"""A commit callback importable by dotted path (the ``onCommit`` option) in Spark's helper.

It appends each commit as a JSON line to ``$KDDB_TEST_CALLBACK_DIR/<application>.jsonl``.
"""

from __future__ import annotations

import json
import os


def record(info) -> None:
    """Append one commit to the application's file."""
    path = os.path.join(os.environ["KDDB_TEST_CALLBACK_DIR"], f"{info.application}.jsonl")
    line = {
        "epoch": info.epoch,
        "positions": {f"{s}/{sh}": seq for (s, sh), seq in sorted(info.positions.items())},
        "ended": sorted(f"{s}/{sh}" for s, sh in info.ended),
    }
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line, sort_keys=True) + "\n")


def explode(info) -> None:
    """A callback that always raises."""
    raise ValueError(f"callback refuses epoch {info.epoch}")


_LOGGING_TO: set[str] = set()


def log_path(application: str) -> str:
    """Where :func:`record_then_explode` has the committer's log of ``application`` written."""
    return os.path.join(os.environ["KDDB_TEST_CALLBACK_DIR"], f"{application}.log")


def record_then_explode(info) -> None:
    """Record the commit as :func:`record` does, then raise as :func:`explode` does. On its
    first call in a process it also sends the committer's log records to
    ``$KDDB_TEST_CALLBACK_DIR/<application>.log``, so a test in another process can see what
    the committer logged about the error (Spark's helper runs the committer, not the test)."""
    import logging

    if info.application not in _LOGGING_TO:
        _LOGGING_TO.add(info.application)
        handler = logging.FileHandler(log_path(info.application), encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logger = logging.getLogger("kinesis_source.checkpoints.callbacks")
        logger.addHandler(handler)
        if logger.getEffectiveLevel() > logging.ERROR:
            logger.setLevel(logging.ERROR)
    record(info)
    explode(info)


def record_write(info) -> None:
    """An ``onWrite`` callback: append each write's figures to ``<stream>.writes.jsonl``."""
    path = os.path.join(os.environ["KDDB_TEST_CALLBACK_DIR"], f"{info.stream}.writes.jsonl")
    line = {"batch_id": info.batch_id, "tasks": info.tasks, "rows": info.rows, "records": info.records,
            "bytes": info.bytes, "requests": info.requests, "refused": dict(info.refused)}
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line, sort_keys=True) + "\n")


def refuse_write(info) -> None:
    """An ``onWrite`` callback that always raises."""
    raise ValueError(f"callback refuses the write of {info.rows} rows")
