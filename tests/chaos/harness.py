"""Size, seed, a background producer and the published figures of the chaos suite.

- ``KDDB_CHAOS_KILLS``: driver SIGKILLs of scenario 1 (default 3, the bounded CI form; the long
  form is 20). With 20 or more the suite also runs the long outages (30 s) and more fencing
  rounds.
- ``KDDB_CHAOS_OUTAGE_S``: length of the DynamoDB and Kinesis outages (default 10 s bounded,
  30 s long).
- ``KDDB_CHAOS_SEED``: the seed of every random choice (default: a new one, printed).
- ``KDDB_CHAOS_REPORT``: a file the figures are also written to (JSON lines).
- ``KDDB_CHAOS_BACKENDS=both``: every scenario that can runs on moto *and* kinesis-local (the
  long form does so by default); the bounded form runs each on one implementation, to stay in
  CI's time.
"""

from __future__ import annotations

import json
import os
import random
import threading
from dataclasses import dataclass, field
from typing import Any

from tests.support.producer import Producer, Put

KILLS = int(os.environ.get("KDDB_CHAOS_KILLS", "3"))
LONG = KILLS >= 20
OUTAGE_S = float(os.environ.get("KDDB_CHAOS_OUTAGE_S", "30" if LONG else "10"))
FENCING_ROUNDS = 3 if LONG else 1
SEED = int(os.environ.get("KDDB_CHAOS_SEED") or random.SystemRandom().randrange(1, 10**6))

BOTH_BACKENDS = LONG or os.environ.get("KDDB_CHAOS_BACKENDS") == "both"

FIGURES: list[dict[str, Any]] = []


def backends(bounded: str) -> tuple[str, ...]:
    """The Kinesis implementations a scenario runs on: ``bounded`` in the bounded form, both
    with ``KDDB_CHAOS_BACKENDS=both`` or in the long form."""
    return ("moto", "kinesis-local") if BOTH_BACKENDS else (bounded,)


def publish(scenario: str, **figures: Any) -> None:
    """Record one scenario's figures for the terminal summary (and ``KDDB_CHAOS_REPORT``)."""
    entry = {"scenario": scenario, "seed": SEED, **figures}
    FIGURES.append(entry)
    path = os.environ.get("KDDB_CHAOS_REPORT")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps(entry, sort_keys=True) + "\n")


def rng_for(name: str) -> random.Random:
    """A generator per scenario, derived from the suite's seed (repeatable one by one)."""
    return random.Random(f"{SEED}:{name}")


@dataclass
class BackgroundProducer:
    """Puts numbered records in bursts from a thread until stopped; ``sent`` afterwards."""

    client: Any
    stream: str
    burst: int = 40
    interval: float = 0.25
    tag: str = "c"
    _producer: Producer = field(init=False)
    _stop: threading.Event = field(default_factory=threading.Event)
    _paused: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self._producer = Producer(self.client, self.stream, tag=self.tag)
        self._lock = threading.Lock()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                with self._lock:
                    if not self._paused.is_set():
                        self._producer.put(self.burst, burst=self.burst)
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def start(self) -> BackgroundProducer:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def pause(self) -> None:
        """Put nothing until :meth:`resume` (a burst under way completes first)."""
        with self._lock:
            self._paused.set()

    def resume(self) -> None:
        self._paused.clear()

    def put(self, count: int) -> list[Put]:
        with self._lock:
            return self._producer.put(count)

    def count(self) -> int:
        with self._lock:
            return len(self._producer.sent)

    def stop(self) -> list[Put]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        if self.error is not None:
            raise AssertionError(f"the producer failed: {self.error!r}")
        return self.sent

    @property
    def sent(self) -> list[Put]:
        with self._lock:
            return list(self._producer.sent)
