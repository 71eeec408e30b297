"""The README's first command, end to end: `kinesis-ddb demo` on its embedded endpoint."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.spark


def test_demo_kills_mid_batch_resumes_from_dynamodb_and_checks_the_counts():
    proc = subprocess.run(
        # a loaded CI machine gets more than the 110 s a user's demo allows itself
        [sys.executable, "-m", "kinesis_source.tools.cli", "demo", "--records", "3000", "--rate", "300",
         "--deadline", "200"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    summary = re.search(
        r"expected (\d+), observed (\d+) distinct, lost (\d+), read twice (\d+) .*?had (\d+)\)",
        " ".join(out.split()),
    )
    assert summary, out[-4000:]
    expected, observed, lost, twice, in_flight = map(int, summary.groups())
    assert expected == observed == 3000 and lost == 0
    assert 0 < in_flight and twice <= in_flight
    # (it ends by itself: past its deadline it fails)
    assert "driver SIGKILLed inside batch" in out and "OK: resumed from DynamoDB" in out
