"""Running the ``kinesis-ddb`` command as a user would, in a child process."""

from __future__ import annotations

import subprocess
import sys


def cli(*args: str, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the kinesis-ddb command with no terminal on standard input (and ``env`` as its
    environment, if given); with ``check``, assert it succeeded (showing its standard error)."""
    proc = subprocess.run(
        [sys.executable, "-m", "kinesis_source.tools.cli", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc
