"""Watching DynamoDB for committed positions that move backwards (or vanish)."""

from __future__ import annotations

import threading

from kinesis_source.checkpoints.format import order_key
from kinesis_source.checkpoints.store import CheckpointStore
from kinesis_source.positions import Position, ShardId
from tests.support.committed import TABLE

_SHARD_END_ORDER = order_key(Position.shard_end())


class RegressionWatch:
    """Polls an application's stored positions (directly, not through any fault proxy) and
    remembers every shard whose position moved backwards or disappeared (other than a shard at
    ``SHARD_END``, which leaves the table once a child of it is committed)."""

    def __init__(self, ddb, app: str, table: str = TABLE, interval: float = 0.05) -> None:
        self._store = CheckpointStore(ddb, table, app)
        self._interval = interval
        self.regressions: list[str] = []
        self.observations = 0
        self.errors = 0
        self.highest: dict[ShardId, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                positions = self._store.snapshot().positions()
            except Exception:  # noqa: BLE001 - the table may not exist yet
                self.errors += 1
                continue
            for key in set(self.highest) - set(positions):
                if self.highest[key] != _SHARD_END_ORDER:  # a finished shard may leave
                    self.regressions.append(f"{key}: {self.highest[key]} -> gone")
                del self.highest[key]
            for key, pos in positions.items():
                order = order_key(pos)
                seen = self.highest.get(key)
                if seen is not None and order < seen:
                    self.regressions.append(f"{key}: {seen} -> {order}")
                self.highest[key] = max(order, seen or order)
            self.observations += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
