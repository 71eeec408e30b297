"""What the driver knows about a shard lives in one record (``driver/shards.py``): after a run
that probes, hands ranges out and applies reports, the planner's objects hold no other map,
set or list keyed by shard, beside the listed snapshots Spark was handed."""

from __future__ import annotations

import dataclasses

from kinesis_source.driver.answers import LastAnswer
from kinesis_source.driver.available_now import Target
from kinesis_source.driver.planner import plan_ranges
from kinesis_source.driver.shards import ShardState, ShardStates
from kinesis_source.positions import Offset, Position, ShardId
from kinesis_source.tip_reports import TipReport
from tests.support.waiting import wait_for
from tests.unit.fake_kinesis import FakeShard, log_of
from tests.unit.test_tip_reports import applied, reporting_planner
from tests.unit.test_tips import TimedFake, trim_horizon

A, B = ShardId("s", "a"), ShardId("s", "b")
SHARDS = {A, B}  # (a ("s", "a") pair is equal to A, so bare pairs are found too)
# Where a shard key may be a key or an element: the records, the two indexes over them, and
# values Spark was handed or that are fixed for the run (an offset, the last answer it is
# patched from, the AvailableNow target).
ALLOWED = {
    "ShardStates._states": "the records",
    "ShardStates.changed": "an index over the records: answers that may differ",
    "ShardStates.unreported": "an index over the records: reads whose report is due",
    "ProbeRounds._due": "an index over the records: the heap of the views' due times",
    "LastAnswer.starts": "the last answer handed to Spark: where it looked for each end",
    "LastAnswer.moved": "the last answer: the shards it moved",
    "LastAnswer.held": "the last answer: the shards it held back",
}
SNAPSHOTS = (Offset, Target)  # immutable values: what they hold cannot drift from the records


def _keyed_by_shard(value) -> bool:
    """True for a map keyed by shard, or a collection holding shard ids (alone or in tuples)."""
    if not isinstance(value, (dict, set, frozenset, list, tuple)):
        return False
    for item in list(value)[:200]:
        if item in SHARDS or (isinstance(item, tuple) and any(part in SHARDS for part in item
                                                             if isinstance(part, tuple))):
            return True
    return False


def shard_keyed_attributes(root) -> dict[str, str]:
    """``Class.attribute`` -> module for every attribute of a ``kinesis_source`` object
    reachable from ``root`` whose value is keyed by shard (records' own fields aside)."""
    found: dict[str, str] = {}
    seen: set[int] = set()
    todo = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        module = type(obj).__module__
        if not module.startswith("kinesis_source") or isinstance(obj, SNAPSHOTS):
            continue
        fields = vars(obj) if hasattr(obj, "__dict__") else {
            f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else {}
        for name, value in fields.items():
            if isinstance(obj, ShardState):
                continue  # (inside the record: where shard state belongs)
            if _keyed_by_shard(value):
                found[f"{type(obj).__name__}.{name}"] = module
            children = value.values() if isinstance(value, dict) else value if isinstance(
                value, (list, tuple, set)) else [value]
            for child in list(children)[:2000]:
                if type(child).__module__.startswith("kinesis_source"):
                    todo.append(child)
                elif isinstance(child, (list, tuple)):
                    todo.extend(c for c in child if type(c).__module__.startswith("kinesis_source"))
    return found


def test_every_per_shard_fact_of_the_driver_is_in_the_shards_record():
    recs = log_of(40)
    fake = TimedFake({"a": FakeShard(recs[:10]), "b": FakeShard(log_of(10, offset=3))})
    planner = reporting_planner(fake)
    try:
        start = trim_horizon(A, B)
        end = planner.latest_offset(start)
        booked, address = planner.hand_over(plan_ranges(start, end))
        assert address is not None and booked
        fake.shards["a"].records.extend(recs[10:20])
        assert applied(address, [TipReport(A, recs[19][0], 0, "a|20|0", end=recs[9][0], past=10)])
        wait_for(lambda: planner.latest_offset(end).shards[A] == Position.after(recs[19][0]),
                 timeout=10, what="the reported tip")
        found = shard_keyed_attributes(planner)
        assert isinstance(planner.shards, ShardStates) and planner.shards.get(A) is not None
        assert isinstance(planner.parts.latest.last, LastAnswer)  # the patched answers ran
        assert {k: m for k, m in found.items() if k not in ALLOWED} == {}
        assert "ShardStates._states" in found  # (the walk reaches the records)
    finally:
        planner.close()
