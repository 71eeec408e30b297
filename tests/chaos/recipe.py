"""The exactly-once recipe of docs/semantics.md, as the chaos suite runs it.

A ``foreachBatch`` sink writes a batch's rows *and* the batch's per-shard ranges in one SQLite
transaction. The output table is keyed by ``(stream, shard, seq, sub)`` with a plain ``INSERT``
(a duplicate would raise ``IntegrityError`` and fail the query, not vanish); ``applied`` keeps, per
shard, the last sequence number written, and rows at or before it (a batch re-delivered after a
restart) are skipped in the same transaction. ``ranges`` records every batch's ranges and how
many of its rows were new.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

Record = tuple[str, str, str, int, str]  # stream, shard, seq, sub, data

_DDL = (
    """CREATE TABLE IF NOT EXISTS records (stream TEXT, shard TEXT, seq TEXT, sub INTEGER,
       data TEXT, run TEXT, batch INTEGER, PRIMARY KEY (stream, shard, seq, sub))""",
    "CREATE TABLE IF NOT EXISTS applied (stream TEXT, shard TEXT, last_seq TEXT, PRIMARY KEY (stream, shard))",
    """CREATE TABLE IF NOT EXISTS ranges (run TEXT, batch INTEGER, stream TEXT, shard TEXT,
       first_seq TEXT, last_seq TEXT, rows INTEGER, fresh INTEGER)""",
)


def write_exactly_once(db: Path, rows: list[Record], run: str, batch_id: int) -> int:
    """Write one batch in one transaction; returns how many rows were new."""
    con = sqlite3.connect(str(db), timeout=120, isolation_level=None)
    try:
        con.execute("BEGIN IMMEDIATE")
        for ddl in _DDL:
            con.execute(ddl)
        applied = {(s, sh): int(seq) for s, sh, seq in con.execute("SELECT stream, shard, last_seq FROM applied")}
        by_shard: dict[tuple[str, str], list[Record]] = {}
        for row in rows:
            by_shard.setdefault((row[0], row[1]), []).append(row)
        fresh_total = 0
        for (stream, shard), shard_rows in by_shard.items():
            mark = applied.get((stream, shard))
            fresh = [r for r in shard_rows if mark is None or int(r[2]) > mark]
            con.executemany(
                "INSERT INTO records (stream, shard, seq, sub, data, run, batch) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(*r, run, batch_id) for r in fresh],
            )
            seqs = [int(r[2]) for r in shard_rows]
            con.execute(
                "INSERT INTO ranges VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (run, batch_id, stream, shard, str(min(seqs)), str(max(seqs)), len(shard_rows), len(fresh)),
            )
            if fresh:
                top = str(max(int(r[2]) for r in fresh))
                con.execute(
                    "INSERT INTO applied VALUES (?, ?, ?) ON CONFLICT (stream, shard) "
                    "DO UPDATE SET last_seq = excluded.last_seq",
                    (stream, shard, top),
                )
            fresh_total += len(fresh)
        con.execute("COMMIT")
        return fresh_total
    except BaseException:
        if con.in_transaction:
            con.execute("ROLLBACK")
        raise
    finally:
        con.close()


def sink_records(db: Path) -> list[tuple[str, str, str, int, str]]:
    """Every row of the output table (stream, shard, seq, sub, data)."""
    if not db.exists():
        return []
    con = sqlite3.connect(str(db), timeout=120)
    try:
        if not con.execute("SELECT 1 FROM sqlite_master WHERE name = 'records'").fetchone():
            return []
        return [tuple(r) for r in con.execute("SELECT stream, shard, seq, sub, data FROM records")]
    finally:
        con.close()


def skipped_rows(db: Path) -> int:
    """Rows the sink received again and skipped (re-deliveries absorbed)."""
    if not db.exists():
        return 0
    con = sqlite3.connect(str(db), timeout=120)
    try:
        if not con.execute("SELECT 1 FROM sqlite_master WHERE name = 'ranges'").fetchone():
            return 0
        return con.execute("SELECT COALESCE(SUM(rows - fresh), 0) FROM ranges").fetchone()[0]
    finally:
        con.close()

