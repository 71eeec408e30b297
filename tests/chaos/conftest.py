"""The chaos suite prints its seed and figures at the end of the run."""

from __future__ import annotations

import json

from tests.chaos import harness


def pytest_report_header(config):
    return (
        f"kinesis-ddb chaos: KDDB_CHAOS_SEED={harness.SEED} KDDB_CHAOS_KILLS={harness.KILLS} "
        f"outage={harness.OUTAGE_S:.0f}s"
    )


def pytest_terminal_summary(terminalreporter):
    if not harness.FIGURES:
        return
    terminalreporter.section("kinesis-ddb chaos figures")
    terminalreporter.write_line(f"seed {harness.SEED} (repeat with KDDB_CHAOS_SEED={harness.SEED})")
    for entry in harness.FIGURES:
        terminalreporter.write_line(json.dumps(entry, sort_keys=True))
