"""``kinesis-ddb demo``: the whole promise in under two minutes, on a local endpoint.

It starts a moto server on 127.0.0.1 (or uses ``--endpoint-url``), creates a stream and the
checkpoint table, starts a producer, and runs a Spark query (a separate driver process) that reads
``format("kinesis-ddb")`` into a parquet sink while a live display shows records in, batches and
per-shard lag. Then it kills the driver with SIGKILL in the middle of a batch, restarts it with a
**new, empty Spark checkpoint**, and shows that it resumed from DynamoDB: every record arrived,
and the only records read twice are those of the batch that was in flight. The exit status is
non-zero if the check fails.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kinesis_source.checkpoints.store import CheckpointStore
from kinesis_source.errors import CheckpointError
from kinesis_source.options import SourceOptions
from kinesis_source.positions import seq_key
from kinesis_source.tools.demo_driver import DriverProcess
from kinesis_source.tools.local import LOCAL_CREDENTIALS, LocalEndpoint
from kinesis_source.tools.produce import LoadProducer


@dataclass
class DemoState:
    """What the live display shows."""

    phase: str = "starting"
    produced: Counter = field(default_factory=Counter)
    consumed: Counter = field(default_factory=Counter)
    batches: int = 0
    source: dict = field(default_factory=dict)
    committed: Counter = field(default_factory=Counter)  # records up to each committed position
    events: list[str] = field(default_factory=list)


def _render(state: DemoState, target: int) -> Any:
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table

    table = Table(title="per shard", expand=False)
    for col in ("shard", "produced", "read", "committed in DynamoDB", "behind"):
        table.add_column(col, justify="right" if col != "shard" else "left")
    for shard in sorted(state.produced):
        made, read = state.produced[shard], state.consumed.get(shard, 0)
        done = state.committed.get(shard, 0)
        table.add_row(shard, f"{made:,}", f"{read:,}", f"{done:,}", f"{max(0, made - read):,}")
    totals = (
        f"records produced {sum(state.produced.values()):,} / {target:,}   "
        f"read {sum(state.consumed.values()):,}   batches {state.batches}"
    )
    source = state.source or {}
    if source:
        totals += (
            f"   probes {source.get('probes', 0)}, driver fetched "
            f"{source.get('driverRecordsFetched', 0)} records"
        )
    events = "\n".join(state.events[-6:])
    return Panel(Group(f"[bold]{state.phase}[/bold]", totals, table, events), title="kinesis-ddb demo")


def _wait(condition, deadline: float, what: str, on_tick=None) -> Any:
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"the demo timed out waiting for {what} (on a slow or busy machine, give it "
                "more time with --deadline)"
            )
        if on_tick:
            on_tick()
        time.sleep(0.25)


def run(
    shards: int,
    records: int,
    rate: float,
    endpoint_url: str | None,
    keep: bool,
    deadline_s: float = 110.0,
) -> int:
    """Run the demo; returns the exit status. It fails by itself after ``deadline_s``."""
    import boto3
    from rich.console import Console
    from rich.live import Live

    console = Console()
    deadline = time.monotonic() + deadline_s
    workdir = Path(tempfile.mkdtemp(prefix="kinesis-ddb-demo-"))
    embedded = None if endpoint_url else LocalEndpoint()
    drivers: list[DriverProcess] = []
    stop = threading.Event()
    try:
        if embedded is not None:
            os.environ.update({k: os.environ.get(k, v) for k, v in LOCAL_CREDENTIALS.items()})
            embedded.start()
        url = endpoint_url or embedded.url  # type: ignore[union-attr]
        region = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
        if boto3.Session().get_credentials() is None:
            console.print(
                f"kinesis-ddb demo: no AWS credentials for the endpoint {url}. Set "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (any values for a local emulator) "
                "or AWS_PROFILE; the demo's Spark query reads them from the environment too."
            )
            return 2
        kinesis = boto3.client("kinesis", endpoint_url=url, region_name=region)
        stream, app = f"demo-{uuid.uuid4().hex[:8]}", f"demo-app-{uuid.uuid4().hex[:8]}"
        kinesis.create_stream(StreamName=stream, ShardCount=shards)
        kinesis.get_waiter("stream_exists").wait(
            StreamName=stream, WaiterConfig={"Delay": 1, "MaxAttempts": 60}
        )
        options = {
            "streamName": stream,
            "applicationName": app,
            "endpointUrl": url,
            "dynamodbEndpointUrl": url,
            "region": region,
            "minProbeIntervalMs": "200",
            "tipReportHost": "127.0.0.1",  # local Spark: the executors run on this machine
        }
        state = DemoState(phase=f"endpoint {url}: stream {stream} ({shards} shards), application {app}")
        producer = LoadProducer(kinesis, stream, size=100, prefix="demo")
        store = CheckpointStore(boto3.client("dynamodb", endpoint_url=url, region_name=region),
                                SourceOptions.parse(options).checkpoint_table, app)
        feeder = threading.Thread(target=producer.run, args=(records, rate), kwargs={"stop": stop}, daemon=True)

        def refresh(live, *runs):
            state.produced = Counter(s.shard_id for s in producer.snapshot())
            state.consumed, state.batches = Counter(), 0
            for d in runs:
                status = d.status()
                state.consumed.update(status.get("per_shard", {}))
                state.batches += status.get("batches", 0)
                state.source = status.get("source") or state.source
            state.committed = _committed(store, producer)
            live.update(_render(state, records))

        with Live(_render(state, records), console=console, refresh_per_second=4) as live:
            # run 1 blocks (and is killed) inside the batch that brings it past a third
            first = DriverProcess("run1", workdir, workdir / "ck1", options, block_at_rows=records // 3)
            drivers.append(first)
            _wait(lambda: first.started() or first.failed(), deadline, "Spark to start",
                  lambda: refresh(live, first))
            feeder.start()  # producing while the query runs, through the kill and the restart
            state.events.append("run 1: Spark query started (checkpoint ck1); producer started")
            batch = _wait(lambda: first.blocked_batch() is not None or first.failed(), deadline,
                          "a batch in flight", lambda: refresh(live, first))
            if first.failed():
                raise RuntimeError(f"the Spark driver exited:\n{first.failed()}")
            batch = first.blocked_batch()
            in_flight = set(first.rows(batch))
            first.kill()
            state.events.append(
                f"run 1: driver SIGKILLed inside batch {batch} ({len(in_flight)} rows written, "
                "not committed)"
            )
            state.phase = "restarting with a NEW, empty Spark checkpoint: resume from DynamoDB"
            second = DriverProcess("run2", workdir, workdir / "ck2", options)
            drivers.append(second)
            state.events.append("run 2: Spark query started (checkpoint ck2, empty)")
            before_kill = first.rows()
            # The batch in flight was written but never committed: only the resumed run can
            # make its records count, by reading them again from the DynamoDB position.
            committed = set(before_kill) - in_flight

            def all_read() -> bool:
                if feeder.is_alive():
                    return False
                sent = {(s.shard_id, s.seq, s.sub_seq, s.data) for s in producer.snapshot()}
                return sent <= committed | set(second.rows())

            _wait(all_read, deadline, "every record", lambda: refresh(live, first, second))
            if second.failed():
                raise RuntimeError(f"the Spark driver exited:\n{second.failed()}")
            # A batch is committed when the query plans the next one: moments later, idle.
            state.phase = "every record read: waiting for DynamoDB to hold the last positions"
            _wait(lambda: +state.committed == +state.produced, deadline,
                  "the last positions in DynamoDB", lambda: refresh(live, first, second))
            state.phase = "done: checking what arrived"
            refresh(live, first, second)
        console.print()  # without a terminal, the live panel's last frame ends without one
        console.rule("result")
        status = _report(console, producer, before_kill, second.rows(), in_flight)
        _show_checkpoints(console, app, url, region, keep=bool(endpoint_url))
        return status
    finally:
        stop.set()
        for d in drivers:
            d.kill()
        if embedded is not None:
            embedded.stop()
        if keep:
            console.print(f"outputs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _committed(store: CheckpointStore, producer: LoadProducer) -> Counter:
    """Per shard, how many of the produced records lie up to the position committed in
    DynamoDB (read there: it is what a restart resumes from)."""
    try:
        positions = store.snapshot().positions()
    except CheckpointError:  # the query has not made the table yet
        return Counter()
    sent = producer.snapshot()
    done: Counter = Counter()
    for key, position in positions.items():
        if position.is_shard_end:
            done[key.shard] = sum(1 for s in sent if s.shard_id == key.shard)
        elif position.seq is not None:
            upto = seq_key(position.seq)
            done[key.shard] = sum(1 for s in sent if s.shard_id == key.shard and seq_key(s.seq) <= upto)
    return done


def _show_checkpoints(console: Any, app: str, url: str, region: str, keep: bool) -> None:
    """What the application left in DynamoDB, as ``kinesis-ddb checkpoints show`` prints it
    (run here while the endpoint is still up), and the command to see it again."""
    from kinesis_source.tools.cli import main as cli

    command = f"kinesis-ddb checkpoints show --app {app} --endpoint-url {url} --region {region}"
    console.rule(f"application {app}: its checkpoints in DynamoDB")
    console.print(f"$ {command}", markup=False, highlight=False, soft_wrap=True)
    cli(["checkpoints", "show", "--app", app, "--endpoint-url", url, "--region", region])
    if not keep:
        console.print("(the embedded endpoint stops with the demo: with --endpoint-url, the "
                      "command above works afterwards too)")


def _report(console: Any, producer: LoadProducer, first: list, second: list, in_flight: set) -> int:
    from rich.table import Table

    sent = {(s.shard_id, s.seq, s.sub_seq, s.data) for s in producer.snapshot()}
    counts = Counter(first + second)
    observed = set(counts)
    lost = sent - (set(first) - in_flight) - set(second)
    duplicated = {r for r, n in counts.items() if n > 1}
    table = Table(title="expected vs observed")
    for col in ("shard", "expected", "observed (distinct)", "read twice", "lost"):
        table.add_column(col, justify="right" if col != "shard" else "left")
    for shard in sorted({r[0] for r in sent}):
        table.add_row(
            shard,
            str(sum(1 for r in sent if r[0] == shard)),
            str(sum(1 for r in observed if r[0] == shard)),
            str(sum(1 for r in duplicated if r[0] == shard)),
            str(sum(1 for r in lost if r[0] == shard)),
        )
    console.print(table)
    ok = not lost and not (observed - sent) and duplicated <= in_flight and all(
        n <= 2 for n in counts.values()
    )
    console.print(
        f"expected {len(sent)}, observed {len(observed)} distinct, lost {len(lost)}, "
        f"read twice {len(duplicated)} (the batch in flight, written but not committed when "
        f"the driver was killed, had {len(in_flight)})"
    )
    if ok:
        console.print("[green]OK[/green]: resumed from DynamoDB with nothing lost; only the "
                      "batch in flight was read again.")
        return 0
    console.print("[red]FAILED[/red]: the resume lost or repeated records beyond the batch in flight.")
    return 1
