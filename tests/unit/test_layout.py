"""The tree says the process model: executor code never loads the driver's or the checkpoint
store's modules (an executor needs only what its partition carries)."""

from __future__ import annotations

import json
import subprocess
import sys

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
