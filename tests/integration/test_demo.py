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
    # the final panel and the results are apart, even without a terminal
    assert re.search(r"─+ result ─+", out), out[-4000:]
    # the application's checkpoints are shown with the command that shows them
    app = re.search(r"application (demo-app-[0-9a-f]{8}): its checkpoints in DynamoDB", out)
    assert app, out[-4000:]
    assert f"$ kinesis-ddb checkpoints show --app {app.group(1)} --endpoint-url http://127.0.0.1:" in out
    assert f"application '{app.group(1)}'" in out or f"application {app.group(1)}" in out
    # the live panel counts what DynamoDB holds: at the end, every record of every shard
    last_panel = out[:out.index("─ result ─")].rsplit("per shard", 1)[-1]
    shards = re.findall(r"(shardId-\d+) │\s+([\d,]+) │\s+([\d,]+) │\s+([\d,]+) │", last_panel)
    assert shards and all(made == done for _, made, _, done in shards), last_panel


def test_demo_on_an_endpoint_without_credentials_says_which_to_set(tmp_path):
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_EC2_METADATA_DISABLED="true")
    proc = subprocess.run([sys.executable, "-m", "kinesis_source.tools.cli", "demo", "--endpoint-url",
                           "http://127.0.0.1:1"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=120, env=env)
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2 and "Traceback" not in out, out[-3000:]
    assert "no AWS credentials for the endpoint http://127.0.0.1:1. Set AWS_ACCESS_KEY_ID" in out, out
