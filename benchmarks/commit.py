"""Commit: the DynamoDB checkpoint store writing 10, 100 and 1,000 shard positions at once:
wall time and DynamoDB API calls per commit, median and spread.

Timed against ``ddb_stub.DynamoStub`` (answers at once: the client side's own cost) and against
moto server. Real DynamoDB adds its latency once per call, as the calls of a commit run one after
another.

    python -m benchmarks.commit [--quick]
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

from benchmarks.common import describe, local_env, settings, summary
from benchmarks.ddb_stub import DynamoStub
from kinesis_source.checkpoints.store import CheckpointStore
from kinesis_source.positions import Position, ShardId
from kinesis_source.tools.local import LocalEndpoint

SHARD_COUNTS = (10, 100, 1000)
# moto's TransactWriteItems copies the table once per item (ddb_stub.py); with positions packed
# into at most 64 items per commit that is affordable at every size.
MOTO_SHARD_COUNTS = SHARD_COUNTS
_BASE_SEQ = 49590338271490256608559692538361571095921575989136588898


class CallCounter:
    """Counts API calls made by one botocore client (one per operation, retries excluded)."""

    def __init__(self, client: Any) -> None:
        self.by_operation: dict[str, int] = {}
        client.meta.events.register("before-call.*.*", self._seen)

    def _seen(self, model: Any, **_: Any) -> None:
        self.by_operation[model.name] = self.by_operation.get(model.name, 0) + 1

    def total(self) -> int:
        """Calls counted so far."""
        return sum(self.by_operation.values())


def measure(url: str, shards: int, repeats: int) -> dict[str, Any]:
    """Commit ``shards`` advancing positions ``repeats`` times (after a warm-up), on a table
    of its own."""
    client = settings(url).boto3_client("dynamodb")  # the source's own DynamoDB client
    table = f"bench-commit-{uuid.uuid4().hex[:8]}"
    store = CheckpointStore(client, table, "bench")
    store.ensure_table(create=True)
    epoch = store.claim("bench", "localhost").epoch
    store.snapshot()  # as a query does after its claim: commits then need no read
    counter = CallCounter(client)
    seconds, calls = [], []
    for rep in range(repeats + 1):
        positions = {
            ShardId("s", f"shardId-{i:012d}"): Position.after(str(_BASE_SEQ + rep * 10_000 + i))
            for i in range(shards)
        }
        before = counter.total()
        start = time.perf_counter()
        returned = store.commit(epoch, "bench", positions)
        elapsed = time.perf_counter() - start
        made = counter.total() - before
        assert made == returned, (made, returned)
        if rep:  # the first commit is the warm-up
            seconds.append(elapsed)
            calls.append(made)
    stored = store.snapshot().positions()
    assert len(stored) == shards and all(p == positions[k] for k, p in stored.items())
    return {"shards": shards, "seconds": summary(seconds), "calls": max(calls)}


def run_suite(moto_url: str, quick: bool) -> list[dict[str, Any]]:
    """Every shard count on the stub and on moto, printed as it goes."""
    repeats = 3 if quick else 5
    out = []
    with DynamoStub() as stub:
        for shards in SHARD_COUNTS:
            r = measure(stub.url, shards, repeats)
            if shards in MOTO_SHARD_COUNTS:
                r["moto_seconds"] = measure(moto_url, shards, repeats)["seconds"]
            moto = f"; on moto {describe(r['moto_seconds'], ' s', 3)}" if "moto_seconds" in r else ""
            print(
                f"  commit {shards:>5} shards: {describe(r['seconds'], ' s', 3)}, "
                f"{r['calls']} calls{moto}",
                flush=True,
            )
            out.append(r)
    return out


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    local_env()
    with LocalEndpoint() as ep:
        run_suite(ep.url, args.quick)


if __name__ == "__main__":
    main()
