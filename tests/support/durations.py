"""Write tests/durations.json from a JUnit XML report (``pytest --junitxml=...`` of a full run):
the seconds of every test that took more than one, which the test order uses (conftest.py).

    python -m tests.support.durations report.xml
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "durations.json"


def node_id(case: ET.Element) -> str:
    """The pytest node id of a JUnit test case (its file from the class name)."""
    module, _, cls = case.get("classname", "").partition(".Test")
    path = module.replace(".", "/") + ".py"
    return "::".join(p for p in (path, cls and "Test" + cls, case.get("name", "")) if p)


def main(report: str) -> None:
    """Write the slow tests' durations, rounded to a tenth of a second."""
    times = {node_id(c): round(float(c.get("time", 0)), 1) for c in ET.parse(report).iter("testcase")}
    OUT.write_text(json.dumps({k: v for k, v in sorted(times.items()) if v > 1.0}, indent=0) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
