"""Cost: the DynamoDB capacity a query's checkpoints use, counted at a sizing front
(``ddb_front.SizingFront``) in front of moto, beside KCL's lease renewals; and the cost table of
``docs/operations.md``.

Each case drives the driver's own commit path (``Checkpointer`` over ``Application`` and
``CheckpointStore``) the way Spark's default trigger does with records arriving: a batch a
second, ``latestOffset`` writing what the batches before it finished, the epoch checked before
each batch, ``commit`` after it. Every shard holds a committed position before counting starts,
and the same 10% of the shards (at least one) move in every batch. The batches run back to back
on a simulated clock (so ``checkpointIntervalMs`` counts simulated seconds); what is measured is
DynamoDB's units, not time. KCL's floor is its lease renewals alone: one conditional
``UpdateItem`` of an item under 1 KB per shard every ``failoverTimeMillis / 3 - 25 ms`` (3.31 s at
the default 10 s), before any checkpoint.

    python -m benchmarks.cost [--quick]
"""

from __future__ import annotations

import argparse
import json
import random
import uuid
from typing import Any

from benchmarks.common import local_env, settings
from benchmarks.ddb_front import SizingFront
from kinesis_source.aws.kinesis import ShardInfo
from kinesis_source.checkpoints.store import CheckpointStore
from kinesis_source.driver.application import Application
from kinesis_source.driver.commits import Checkpointer
from kinesis_source.options import SourceOptions
from kinesis_source.positions import Offset, Position, ShardId
from kinesis_source.tools.local import LocalEndpoint

SHARD_COUNTS = (4, 100, 1000, 4000)
SAME_MOVING = (40, 1000, 4000)  # shard counts for "the same 40 moving"
BATCHES = 240  # four minutes of batches: past three compactions of the log (64 commits each)
KCL_RENEWAL_S = 10.0 / 3 - 0.025
KCL_WRU_PER_SHARD_MINUTE = 60 / KCL_RENEWAL_S
STREAM = "cost"
# Kinesis' 56-digit sequence numbers share little between shards: each shard's start is random
# past a common prefix (the worst case for the log's deflate), and each batch moves it on.
_PREFIX = "49590338"


class FixedShards:
    """The shard listing of one stream that never reshards (what the commit path asks of it)."""

    def __init__(self, shards: int) -> None:
        self._shards = [ShardInfo(f"shardId-{i:012d}") for i in range(shards)]

    def listed(self) -> dict[str, list[ShardInfo]]:
        return {STREAM: list(self._shards)}

    def shard_ids(self) -> set[ShardId]:
        return {ShardId(STREAM, s.shard_id) for s in self._shards}

    def stream_identities(self) -> dict[str, str]:
        return {STREAM: "2026-11-28T00:00:00.000+00:00"}

    def streams_entering(self, start: Offset) -> list[str]:
        return []

    def resolve_initial(self, spec: Any, streams: Any = None) -> Offset:
        return Offset({k: Position.trim_horizon() for k in self.shard_ids()})


class SimulatedClock:
    """Seconds that move only when told."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_case(front: SizingFront, url: str, shards: int, moving: int, interval_ms: int,
             batches: int) -> dict[str, Any]:
    """One application's batches; units counted from the first batch after every shard holds a
    position (the check at the end reads the server at ``url`` directly, uncounted)."""
    opts = SourceOptions.parse({
        "streamName": STREAM, "applicationName": f"cost-{uuid.uuid4().hex[:8]}",
        "checkpointIntervalMs": str(interval_ms), "region": "us-east-1",
    })
    client = settings(front.url).boto3_client("dynamodb")
    store = CheckpointStore(client, opts.checkpoint_table, opts.application_name)
    catalogue = FixedShards(shards)
    app = Application(opts, store, catalogue)
    clock = SimulatedClock()
    checkpointer = Checkpointer(app, clock=clock)
    ids = sorted(catalogue.shard_ids(), key=str)
    rng = random.Random(shards)
    base = {k: int(_PREFIX + "".join(rng.choices("0123456789", k=48))) for k in ids}
    offset = Offset({k: Position.after(str(base[k])) for k in ids})
    checkpointer.commit(offset)  # every shard holds a position
    active = ids[:: max(1, shards // moving)][:moving]
    front.reset()
    commits_before = checkpointer.commit_calls
    previous = offset
    for batch in range(1, batches + 1):
        clock.now = float(batch)
        for k in active:
            base[k] += rng.randrange(10**20, 10**21)  # the records of a second
        moved = {k: Position.after(str(base[k])) for k in active}
        end = Offset({**previous.shards, **moved})
        with checkpointer.committing(previous):  # latestOffset: the batches before are done
            done = previous
        checkpointer.after_planning(batch_follows=True)
        checkpointer.before_batch()  # the batch's partitions
        checkpointer.commit(previous)  # Spark's commit, a batch behind
        previous = end
    checkpointer.close()
    minutes = batches / 60
    # every batch's moves reached the table (a move that did not advance would be skipped)
    direct = settings(url).boto3_client("dynamodb")
    reread = CheckpointStore(direct, opts.checkpoint_table, opts.application_name).snapshot()
    if reread.positions() != done.shards:
        raise AssertionError(f"{shards} shards: the table does not hold the last batch's positions")
    wru, rru = sum(front.write_units.values()), sum(front.read_units.values())
    return {
        "shards": shards,
        "moving": len(active),
        "interval_ms": interval_ms,
        "batches": batches,
        "write_units": wru,
        "write_units_by_operation": dict(front.write_units),
        "read_units": rru,
        "read_units_by_operation": dict(front.read_units),
        "calls": dict(front.calls),
        "commit_calls": checkpointer.commit_calls - commits_before,
        "wru_per_shard_minute": wru / shards / minutes,
        "rru_per_shard_minute": rru / shards / minutes,
        "kcl_ratio": wru / shards / minutes / KCL_WRU_PER_SHARD_MINUTE,
        "wru_per_batch": wru / batches,
    }


def run_suite(url: str, quick: bool = False) -> dict[str, Any]:
    """Every case, on moto at ``url`` behind one sizing front."""
    batches = 70 if quick else BATCHES
    counts = (4, 100) if quick else SHARD_COUNTS
    with SizingFront(url) as front:
        rows = []
        for shards in counts:
            for interval in (0, 10_000):
                # with a commit every 10 s, four times the batches: the log's ring (64 commits)
                # is compacted at least once in the run, as in the every-batch cases
                row = run_case(front, url, shards, max(1, shards // 10), interval,
                               batches * (4 if interval else 1))
                rows.append(row)
                print(f"  {shards} shards, interval {interval} ms: {row['wru_per_shard_minute']:.3f} WRU "
                      f"per shard per minute ({row['kcl_ratio']:.4f}x KCL's renewals), "
                      f"{row['wru_per_batch']:.1f} per batch, {row['rru_per_shard_minute']:.3f} RRU", flush=True)
        same = []
        for shards in (SAME_MOVING[:1] if quick else SAME_MOVING):
            row = run_case(front, url, shards, 40, 0, batches)
            same.append(row)
            print(f"  {shards} shards, 40 moving: {row['wru_per_batch']:.1f} WRU per batch", flush=True)
    return {
        "rows": rows,
        "same_moving": same,
        "kcl_wru_per_shard_minute": KCL_WRU_PER_SHARD_MINUTE,
        "batch_period_s": 1.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    local_env()
    with LocalEndpoint() as ep:
        print(json.dumps(run_suite(ep.url, args.quick), indent=1)[:2000])


if __name__ == "__main__":
    main()
