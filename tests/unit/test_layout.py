"""The tree says the process model: executor code never loads the driver's or the checkpoint
store's modules (an executor needs only what its partition carries); and its parts stay small."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

FORBIDDEN = ("kinesis_source.driver", "kinesis_source.checkpoints", "kinesis_source.tools")


@pytest.mark.parametrize("entry", ["kinesis_source.executor", "kinesis_source.source"])
def test_executor_entry_loads_no_driver_module(entry):
    """``kinesis_source.source`` is what an executor unpickles the reader from; its driver
    parts are imported only when the driver's helper first plans."""
    code = (
        f"import json, sys, {entry}; "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('kinesis_source'))))"
    )
    loaded = json.loads(subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout)
    assert "kinesis_source.executor.polling" in loaded  # the check sees the package's modules
    assert [m for m in loaded if m.startswith(FORBIDDEN)] == []


MODULE_MAX_LINES = 400
CLASS_MAX_LINES = 250
# Declarative tables of options (key, type, default, description: the docs are generated from
# them) are long by nature and hold no logic to split.
OPTION_TABLES = {"kinesis_source/options.py": "SourceOptions", "kinesis_source/sink/options.py": "SinkOptions",
                 "kinesis_source/aws/options.py": "ConnectionOptions"}


def _sources():
    root = Path(__file__).resolve().parents[2]
    return root, sorted((root / "kinesis_source").rglob("*.py"))


def test_modules_and_classes_stay_small_enough_to_hold_in_ones_head():
    """No module over 400 lines, no class over 250 (option tables aside): a part that grows
    past that has taken a second job, which goes into a module of its own."""
    root, paths = _sources()
    too_long = []
    for path in paths:
        rel = path.relative_to(root).as_posix()
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MODULE_MAX_LINES and rel not in OPTION_TABLES:
            too_long.append(f"{rel}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and OPTION_TABLES.get(rel) != node.name:
                size = node.end_lineno - node.lineno + 1
                if size > CLASS_MAX_LINES:
                    too_long.append(f"{rel}: class {node.name} {size} lines")
    assert too_long == []
