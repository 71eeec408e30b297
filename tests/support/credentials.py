"""Credentials providers for the ``credentialsProvider`` tests: each call is recorded (process
id, time) in a file under ``KDDB_TEST_CALLBACK_DIR``, so the tests see which processes called
it and how often."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

ACCESS_KEY = "AKIDPROVIDED"
SECRET = "provided-secret-value"


def _record(name: str) -> None:
    path = Path(os.environ["KDDB_TEST_CALLBACK_DIR"]) / f"credentials-{name}.jsonl"
    with path.open("a") as fh:
        fh.write(json.dumps({"pid": os.getpid(), "at": time.time()}) + "\n")


def lasting() -> dict:
    """Credentials without an expiry."""
    _record("lasting")
    return {"access_key": ACCESS_KEY, "secret_key": SECRET}


def short_lived() -> dict:
    """Credentials that expire in a minute (inside botocore's refresh window: every request
    that needs them calls the provider again)."""
    _record("short_lived")
    expiry = datetime.now(timezone.utc) + timedelta(minutes=1)
    return {"access_key": ACCESS_KEY, "secret_key": SECRET, "token": "tok", "expiry_time": expiry}


def broken() -> dict:
    """A provider that returns the wrong thing."""
    return {"key": "x"}


def calls(name: str) -> list[dict]:
    """The recorded calls of provider ``name``."""
    path = Path(os.environ["KDDB_TEST_CALLBACK_DIR"]) / f"credentials-{name}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
