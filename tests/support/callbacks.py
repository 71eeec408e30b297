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
