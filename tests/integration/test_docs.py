"""The Python snippets of docs/quickstart.md that say they run, run (against the local endpoint)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.mark.spark
def test_quickstart_local_snippet_runs(tmp_path):
    blocks = [b for b in python_blocks((DOCS / "quickstart.md").read_text()) if "LocalEndpoint" in b]
    assert len(blocks) == 1, "the runnable local example is missing"
    script = tmp_path / "quickstart.py"
    script.write_text(blocks[0])
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rows: 100" in proc.stdout


def test_every_doc_is_linked_from_the_readme():
    readme = (DOCS.parent / "README.md").read_text()
    for doc in DOCS.glob("*.md"):
        assert f"docs/{doc.name}" in readme, f"README does not link docs/{doc.name}"
