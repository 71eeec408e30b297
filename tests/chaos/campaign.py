"""Scenario 1 and 3 as a function: SIGKILL a driver at seeded random points, restart it keeping
and dropping the Spark checkpoint in turn, then count what the sinks received."""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kinesis_source.errors import CheckpointError
from kinesis_source.positions import AFTER, AT, Position, ShardId, seq_key
from tests.chaos.chaos_source import PAUSE_PHASES
from tests.chaos.driver import SINK_PHASES, ChaosDriver
from tests.chaos.harness import BackgroundProducer
from tests.chaos.recipe import sink_records, skipped_rows
from tests.support.checker import Delivery, Report, check, key_order_violations, load_deliveries, per_shard
from tests.support.committed import stored, tips
from tests.support.regression import RegressionWatch
from tests.support.waiting import wait_for

# Where a kill is aimed: a pause point (the driver blocks there and is killed), or "random": a
# kill at a random moment, attributed afterwards to the phase the phase log shows. Kill i aims at
# group i % 4 (a random member), so even the 3 kills of the bounded form hit planning, reading and
# committing.
TARGET_GROUPS = (
    ("planning", "partitions"),
    ("reading",),
    ("committing", *SINK_PHASES),
    ("random",),
)
assert {t for g in TARGET_GROUPS for t in g} == {*PAUSE_PHASES, *SINK_PHASES, "random"}


@dataclass
class Kill:
    run: str
    target: str
    hit: str
    after_s: float
    master: str
    keep_checkpoint_next: bool


@dataclass
class Outcome:
    report: Report
    kills: list[Kill]
    runs: list[str]
    sent: int
    sink_rows: int
    sink_duplicates: int
    sink_skipped: int
    redelivered: dict[str, int] = field(default_factory=dict)  # restart run -> rows read again
    in_flight: dict[str, int] = field(default_factory=dict)  # restart run -> its bound
    replays_identical: int = 0
    replays_by_run: dict[str, int] = field(default_factory=dict)  # run -> identical replays
    delivering_runs: set[str] = field(default_factory=set)  # runs that delivered a batch
    out_of_key_order: int = 0  # rows after a later-put row of their partition key, within a run
    # restart run -> shard -> the position DynamoDB held when it started
    committed_at_start: dict[str, dict[str, Position]] = field(default_factory=dict)
    # checkpoint-dropping restart -> rows read again from before its in-flight batch, that no
    # run had committed (runs killed before their first commit leave such rows behind)
    uncommitted_older: dict[str, int] = field(default_factory=dict)

    def figures(self) -> dict[str, Any]:
        keep = [r for k, r in zip(self.kills, self.runs[1:], strict=False) if k.keep_checkpoint_next]
        drop = [r for k, r in zip(self.kills, self.runs[1:], strict=False) if not k.keep_checkpoint_next]
        totals = self.report.totals()
        return {
            "runs": len(self.runs),
            "kills": len(self.kills),
            "kill_phases": dict(Counter(k.hit for k in self.kills)),
            "kills_by_master": dict(Counter(k.master for k in self.kills)),
            "records": self.sent,
            "delivered": totals["delivered"],
            "lost": totals["lost"],
            "invented": totals["invented"],
            "duplicated": totals["duplicated"],
            "out_of_order": totals["out_of_order"],
            "out_of_key_order": self.out_of_key_order,
            "duplicated_after_keep": sum(self.redelivered.get(r, 0) for r in keep),
            "duplicated_after_drop": sum(self.redelivered.get(r, 0) for r in drop),
            "max_in_flight_bound": max(self.in_flight.values(), default=0),
            "duplicated_uncommitted_older": sum(self.uncommitted_older.values()),
            "identical_replays": self.replays_identical,
            "exactly_once_sink_rows": self.sink_rows,
            "exactly_once_sink_duplicates": self.sink_duplicates,
            "exactly_once_sink_skipped": self.sink_skipped,
        }


def run_campaign(
    *,
    kinesis: Any,
    ddb: Any,
    stream: str,
    options: dict[str, str],
    out: Path,
    kills: int,
    rng: random.Random,
    masters: dict[int, str] | None = None,
    hooks: dict[int, Callable[[ChaosDriver], bool | None]] | None = None,
    between: Callable[[int], None] | None = None,
    settled: Callable[[dict[ShardId, Any], list], bool] | None = None,
    producer: BackgroundProducer | None = None,
    startup_timeout: float = 240,
) -> Outcome:
    """Produce continuously; run ``kills + 1`` drivers, SIGKILLing all but the last at a
    random point; the last one drains. Run i runs on ``masters[i]`` (default ``local[2,4]``)
    and, once started, calls ``hooks[i](driver)`` before it is killed: a hook that returns True
    has the run killed at once instead of at a seeded target. ``between(i)`` runs after kill i,
    before the restart (the query is down). The drained stream is settled when
    ``settled(stored positions, records sent)`` holds (default: DynamoDB holds every written
    shard's tip). ``producer`` (started here) defaults to numbered records in bursts of 20 every
    0.5 s. Returns the counted outcome (asserts nothing)."""
    masters, hooks = masters or {}, hooks or {}
    app = options["applicationName"]
    db = out / "sink.db"
    producer = (producer or BackgroundProducer(kinesis, stream, burst=20, interval=0.5)).start()
    settled = settled or (lambda table, sent: _at_tips(stream, table, sent))
    watch = RegressionWatch(ddb, app)
    runs: list[str] = []
    kill_log: list[Kill] = []
    committed_at_start: dict[str, dict[str, Position]] = {}
    ck = 0
    driver: ChaosDriver | None = None
    try:
        for i in range(kills + 1):
            keep = i % 2 == 1  # restarts alternate: the 1st keeps the Spark checkpoint, the 2nd drops it
            if i > 0 and not keep:
                ck += 1
            run = f"run{i:02d}"
            runs.append(run)
            if i > 0:
                committed_at_start[run] = _committed(ddb, app, stream)
            driver = ChaosDriver(run, out, out / f"ck{ck}", options, master=masters.get(i, "local[2,4]"), db=db)
            wait_for(lambda driver=driver: driver.check_alive() and driver.started(), timeout=startup_timeout,
                     what=f"driver {run} to start")
            kill_now = bool(hooks[i](driver)) if i in hooks else False
            if i == kills:
                break
            # a hook's kill comes at once and draws nothing from rng (the other kills keep their seeds)
            target, hit = ("hook", driver.phase_now()) if kill_now else _aim(driver, run, i, rng)
            after = time.monotonic() - driver.started_at
            driver.kill()
            kill_log.append(Kill(run, target, hit, round(after, 1), masters.get(i, "local[2,4]"),
                                 keep_checkpoint_next=(i + 1) % 2 == 1))
            if between is not None:
                between(i)
        sent = producer.stop()
        want = {(p.shard_id, p.seq) for p in sent}
        final = driver
        assert final is not None

        def drained() -> bool:
            final.check_alive()
            got = {(r[1], r[2]) for r in sink_records(db)}
            return want <= got

        wait_for(drained, timeout=300, interval=0.5, what="the last run to drain the stream")
        wait_for(lambda: final.check_alive() and settled(stored(ddb, app), sent),
                 timeout=120, what="DynamoDB to hold every shard's tip")
    finally:
        producer.stop() if producer.error is None else None
        watch.stop()
        if driver is not None:
            driver.kill()
    assert not watch.regressions, f"stored positions moved backwards: {watch.regressions}"
    assert watch.observations > 10, "the regression watch did not run"

    deliveries = load_deliveries(out / "deliveries", runs)
    report = check(((p.shard_id, p.seq) for p in sent), deliveries)
    rows = sink_records(db)
    keyed = Counter((r[1], r[2], r[3]) for r in rows)
    outcome = Outcome(
        report=report,
        kills=kill_log,
        runs=runs,
        sent=len(sent),
        sink_rows=len(rows),
        sink_duplicates=sum(n - 1 for n in keyed.values()),
        sink_skipped=skipped_rows(db),
        out_of_key_order=key_order_violations(sent, deliveries),
        committed_at_start=committed_at_start,
    )
    _bounds(outcome, deliveries, runs)
    if {(r[1], r[2]) for r in rows} != want:
        raise AssertionError("the exactly-once sink does not hold exactly the records put")
    return outcome


def _aim(driver: ChaosDriver, run: str, i: int, rng: random.Random) -> tuple[str, str]:
    """Wait for kill ``i``'s seeded moment (a pause point of its target group, or a random
    time); returns the target and the phase it hit."""
    target = rng.choice(TARGET_GROUPS[i % len(TARGET_GROUPS)])
    delay = rng.uniform(0.5, 8.0) if target == "random" else rng.uniform(0.0, 3.0)
    deadline = time.monotonic() + delay
    wait_for(lambda: driver.check_alive() and time.monotonic() >= deadline,
             timeout=delay + 30, what=f"{delay:.1f}s into {run}")
    if target == "random":
        return target, driver.phase_now()
    driver.pause_at(target)
    wait_for(lambda: driver.check_alive() and driver.paused(), timeout=240, what=f"driver {run} to reach {target}")
    return target, target


def _committed(ddb: Any, app: str, stream: str) -> dict[str, Position]:
    """Per shard of ``stream``, the position DynamoDB holds now (nothing before the first run
    created the table)."""
    try:
        return {sid.shard: pos for sid, pos in stored(ddb, app).items() if sid.stream == stream}
    except CheckpointError:
        return {}


def uncommitted(position: Position | None, seq: str) -> bool:
    """Whether the record ``seq`` lies after ``position`` (a resume from it reads the record)."""
    if position is None or position.seq is None:
        return not (position is not None and position.is_shard_end)
    if position.kind == AFTER:
        return seq_key(seq) > seq_key(position.seq)
    return position.kind == AT and seq_key(seq) >= seq_key(position.seq)


def _at_tips(stream: str, table: dict[ShardId, Any], sent: list) -> bool:
    tip = {ShardId(stream, sh): pos for sh, pos in tips(sent).items()}
    return {k: v for k, v in table.items() if k in tip} == tip


def _bounds(outcome: Outcome, deliveries: list[Delivery], runs: list[str]) -> None:
    """Per restart: the rows read again, the in-flight batch that bounds them, and whether
    replays of a batch under a kept checkpoint were identical (checked by the caller).

    A restart that drops the Spark checkpoint resumes from DynamoDB, so it may also read again
    rows delivered before the last batch that no run committed: when every run since a
    delivery was killed before its first commit, the killed run's batch in flight starts at that
    older position (it was never delivered, so the last delivered batch alone is too narrow a
    bound). Rows at or before what DynamoDB held at the restart are never allowed again."""
    by_run: dict[str, list[Delivery]] = {r: [] for r in runs}
    for d in deliveries:
        by_run[d.run].append(d)
    delivered_before: set = set()
    last_batch: Delivery | None = None
    previous_on_checkpoint: dict[int, Delivery] = {}
    outcome.mismatched_replays = []  # type: ignore[attr-defined]
    outcome.beyond_bound = []  # type: ignore[attr-defined]
    for i, run in enumerate(runs):
        mine = by_run[run]
        if mine:
            outcome.delivering_runs.add(run)
        kept = i > 0 and i % 2 == 1
        if i > 0:
            rows = {key for d in mine for key in d.rows}
            again = rows & delivered_before
            bound = set(last_batch.rows) if last_batch else set()
            if not kept:
                held = outcome.committed_at_start.get(run, {})
                older = {(shard, seq) for shard, seq in delivered_before - bound
                         if uncommitted(held.get(shard), seq)}
                outcome.uncommitted_older[run] = len(again & older)
                bound |= older
            outcome.redelivered[run] = len(again)
            outcome.in_flight[run] = len(bound)
            if not again <= bound:
                outcome.beyond_bound.append(  # type: ignore[attr-defined]
                    f"{run}: {len(again - bound)} rows read again beyond the in-flight batch "
                    f"({run} {'kept' if kept else 'dropped'} the checkpoint)"
                )
            if kept:
                for d in mine:
                    before = previous_on_checkpoint.get(d.batch)
                    if before is not None:
                        if per_shard(before.rows) == per_shard(d.rows):
                            outcome.replays_identical += 1
                            outcome.replays_by_run[run] = outcome.replays_by_run.get(run, 0) + 1
                        else:
                            outcome.mismatched_replays.append(  # type: ignore[attr-defined]
                                f"batch {d.batch}: {before.run} and {run} delivered different rows"
                            )
        if i > 0 and not kept:
            previous_on_checkpoint = {}
        for d in mine:
            previous_on_checkpoint[d.batch] = d
            delivered_before |= set(d.rows)
            last_batch = d


def replays_due(outcome: Outcome) -> list[str]:
    """The restarts that must have replayed a batch identically: those keeping the Spark
    checkpoint after a kill aimed inside the sink (the batch's rows were delivered, its
    delivery file written, and Spark's commit of the batch not: the restart runs it again),
    and that delivered any batch before they were killed in turn (the replay comes first; a
    restart killed before its first delivery, as slow fan-out starts can be, shows nothing)."""
    return [
        run for kill, run in zip(outcome.kills, outcome.runs[1:], strict=False)
        if kill.hit in SINK_PHASES and kill.keep_checkpoint_next and run in outcome.delivering_runs
    ]


def assert_replayed_where_due(outcome: Outcome, why: str = "") -> None:
    """Each restart that must have replayed a batch did (identical replays counted, not
    merely none mismatched: a campaign whose replays were never compared passed before)."""
    missing = [run for run in replays_due(outcome) if outcome.replays_by_run.get(run, 0) < 1]
    assert not missing, f"no identical replay in {missing} after a kill in the sink\n{why}"
    assert outcome.replays_identical == sum(outcome.replays_by_run.values())


def describe(outcome: Outcome, seed: int) -> str:
    """A failure message: seed, kills and the per-shard table."""
    kills = "\n".join(
        f"  {k.run} ({k.master}): aimed at {k.target}, hit {k.hit}, {k.after_s}s after start; restart "
        f"{'keeps' if k.keep_checkpoint_next else 'drops'} the checkpoint"
        for k in outcome.kills
    )
    return (
        f"seed {seed} (rerun with KDDB_CHAOS_SEED={seed})\n{kills}\n{outcome.report.table()}\n"
        f"{json.dumps(outcome.figures(), sort_keys=True)}"
    )
