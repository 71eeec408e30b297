"""The oldest supported pyspark (4.0) reads a stream end to end, in the second virtualenv that
./dev makes (.venv-pyspark40)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

OLD_PYTHON = Path(__file__).resolve().parents[2] / ".venv-pyspark40" / "bin" / "python"


def smoke(module: str) -> dict:
    """Run ``module`` with pyspark 4.0's interpreter; the JSON line it printed last."""
    assert OLD_PYTHON.exists(), "run ./dev setup: it makes .venv-pyspark40"
    proc = subprocess.run(
        [str(OLD_PYTHON), "-m", module],
        cwd=OLD_PYTHON.parents[2], capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_pyspark_4_0_reads_every_record_once():
    result = smoke("tests.support.smoke_read")
    assert result["pyspark"].startswith("4.0."), result["pyspark"]
    assert result["error"] is None
    assert len(result["got"]) == len(set(map(tuple, result["got"]))) == 150
    assert sorted(map(tuple, result["got"])) == sorted(map(tuple, result["sent"]))
    # maxRecordsPerBatch holds on 4.0 (no ReadLimit there): batches of at most 40 rows, all read.
    assert max(result["limited"]) <= 40 and sum(result["limited"]) == 150, result["limited"]
    # AvailableNow on 4.0 is Spark's fallback: one batch to the offset found at start, which the
    # option limits (documented in docs/semantics.md).
    assert result["availableNow"] == [40], result["availableNow"]
    # Issue 14 item 5: a restart from Spark's checkpoint plans from Spark's start (learnt from
    # the partitions(end, end) call pyspark 4.0 makes first), not from DynamoDB's position one
    # batch behind it: the batches after the restart hold no record delivered before it, except
    # a replay of the batch in flight at the stop (same batch id, identical rows).
    before, after = result["restart"]
    first_rows = {bid: sorted(map(tuple, rows)) for bid, rows in before}
    seen = set().union(*first_rows.values())
    new = [tuple(r) for bid, rows in after if bid not in first_rows for r in rows]
    replayed = [(bid, sorted(map(tuple, rows))) for bid, rows in after if bid in first_rows]
    assert all(first_rows[bid] == rows for bid, rows in replayed), replayed
    assert not seen & set(new), sorted(seen & set(new))[:5]
    assert len(new) == len(set(new)) and seen | set(new) == set(map(tuple, result["sent"]))
    # the first batch after the restart may replay one planned before it (limit 40)
    assert max(len(rows) for _, rows in after[1:]) <= 10


def test_pyspark_4_0_writes_batches_and_streams_through_the_sink():
    result = smoke("tests.support.smoke_write")
    assert result["pyspark"].startswith("4.0."), result["pyspark"]
    assert result["error"] is None
    assert result["batch"] == sorted(f"b-{i}" for i in range(90))
    assert result["copy"] == sorted(f"s-{i}" for i in range(120))
