"""The delivery checker: lost, duplicated and out-of-order records per shard.

Input: what the producer put (shard and sequence number of every record) and what a sink
received, as deliveries (one per batch a run delivered, rows in delivery order). Runs are the
driver processes, in the order they ran; within a run, deliveries are in batch order.

- **lost**: put, never delivered;
- **invented**: delivered, never put;
- **duplicated**: deliveries beyond the first of a record;
- **out of order**: within one run, a shard's rows (concatenated over its batches) that come
  after a row with a higher sequence number (a restart may go back; a run may not);
- **out of key order** (:func:`key_order_violations`): within one run, a partition key's rows that
  come after a row of the same key put later, across shards: a child's record delivered before
  its parent's is one.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kinesis_source.positions import seq_key

Key = tuple[str, str]  # shardId, sequenceNumber


@dataclass(frozen=True)
class Delivery:
    """One batch with rows, as one run delivered it."""

    run: str
    batch: int
    rows: tuple[Key, ...]


def per_shard(rows: Iterable[Any]) -> dict[str, list]:
    """``rows`` (``(shard, seq)`` keys or sink rows with a ``shard_id``) grouped by shard, each
    shard's in delivery order: what a replayed batch must reproduce. A task that reads several
    shards interleaves their records as they arrive, so the order across shards is not part of a
    batch."""
    out: dict[str, list] = {}
    for row in rows:
        out.setdefault(getattr(row, "shard_id", None) or row[0], []).append(row)
    return out


@dataclass
class ShardFigures:
    """The checker's figures for one shard."""

    sent: int = 0
    delivered: int = 0
    lost: int = 0
    invented: int = 0
    duplicated: int = 0
    out_of_order: int = 0


@dataclass
class Report:
    """Per-shard figures and totals."""

    shards: dict[str, ShardFigures] = field(default_factory=dict)

    def total(self, name: str) -> int:
        return sum(getattr(f, name) for f in self.shards.values())

    def totals(self) -> dict[str, int]:
        names = ("sent", "delivered", "lost", "invented", "duplicated", "out_of_order")
        return {n: self.total(n) for n in names}

    def table(self) -> str:
        lines = ["shard                  sent  delivered  lost  invented  duplicated  out-of-order"]
        for shard, f in sorted(self.shards.items()):
            lines.append(
                f"{shard:<20} {f.sent:>6} {f.delivered:>10} {f.lost:>5} {f.invented:>9} "
                f"{f.duplicated:>11} {f.out_of_order:>13}"
            )
        return "\n".join(lines)


def load_deliveries(directory: Path, runs: list[str]) -> list[Delivery]:
    """The ``<run>-<batch>.json`` files the chaos driver wrote, runs in the given order."""
    order = {run: i for i, run in enumerate(runs)}
    found = []
    for path in Path(directory).glob("*.json"):
        data = json.loads(path.read_text())
        if data["run"] not in order:
            continue
        rows = tuple((r[1], r[2]) for r in data["rows"])
        found.append(Delivery(data["run"], int(data["batch"]), rows))
    return sorted(found, key=lambda d: (order[d.run], d.batch))


def check(sent: Iterable[Key], deliveries: list[Delivery]) -> Report:
    """Count lost, invented, duplicated and out-of-order records per shard."""
    report = Report()
    sent_set: set[Key] = set()
    for shard, seq in sent:
        report.shards.setdefault(shard, ShardFigures()).sent += 1
        sent_set.add((shard, seq))
    counts: Counter[Key] = Counter()
    last_in_run: dict[tuple[str, str], str] = {}  # (run, shard) -> seq
    for d in deliveries:
        for shard, seq in d.rows:
            figures = report.shards.setdefault(shard, ShardFigures())
            figures.delivered += 1
            counts[(shard, seq)] += 1
            prev = last_in_run.get((d.run, shard))
            if prev is not None and seq_key(seq) < seq_key(prev):
                figures.out_of_order += 1
            last_in_run[(d.run, shard)] = seq
    for (shard, _), n in counts.items():
        report.shards[shard].duplicated += n - 1
    for key in sent_set - set(counts):
        report.shards[key[0]].lost += 1
    for key in set(counts) - sent_set:
        report.shards[key[0]].invented += 1
    return report


def key_order_violations(sent: Iterable[Any], deliveries: list[Delivery]) -> int:
    """Rows delivered, within one run, after a row of the same partition key that was put later.

    ``sent`` are the producer's puts (``shard_id``, ``seq``, ``partition_key``) in the order they
    were put; one producer puts a key's records in order, so that order is the key's. Rows not
    put are the checker's ``invented`` and skipped here."""
    put_at: dict[Key, tuple[str, int]] = {
        (p.shard_id, p.seq): (p.partition_key, i) for i, p in enumerate(sent)
    }
    violations = 0
    last: dict[tuple[str, str], int] = {}  # (run, partition key) -> put index
    for d in deliveries:
        for row in d.rows:
            found = put_at.get(row)
            if found is None:
                continue
            key, index = found
            prev = last.get((d.run, key))
            if prev is not None and index < prev:
                violations += 1
            last[(d.run, key)] = max(index, prev if prev is not None else index)
    return violations
