"""A Spark driver process for the chaos suite, and :class:`ChaosDriver`, the test's handle on it.

    python -m tests.chaos.driver --run R --dir D --checkpoint CK [--master M] [--db sink.db]
        [--format kinesis-ddb-chaos] [--event-log DIR] [--log-level ERROR] --option k=v ...

Each batch with rows is

1. written as ``D/deliveries/<run>-<batchId>.json`` (atomically: written, then renamed): the raw,
   at-least-once record of what Spark delivered, row by row, in delivery order;
2. (pause point ``sink-before-db``)
3. written with the exactly-once recipe (``recipe.py``) to the SQLite file ``--db``;
4. (pause point ``sink-after-db``)
and every second the query's ``recentProgress`` is written to ``D/<run>.progress.jsonl``.

A query that fails writes its error to ``D/<run>.error.txt`` and exits with status 3.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from tests.chaos.chaos_source import CHAOS_FORMAT, note, pause_point

SINK_PHASES = ("sink-before-db", "sink-after-db")
_PRIORITY = ("sink", "committing", "reading", "partitions", "planning")


class ChaosDriver:
    """One driver run in its own process group (SIGKILL takes the JVM and Python workers)."""

    def __init__(
        self,
        run: str,
        out: Path,
        checkpoint: Path,
        options: Mapping[str, str],
        *,
        master: str = "local[2,4]",
        fmt: str = CHAOS_FORMAT,
        db: Path | None = None,
        event_log: Path | None = None,
        log_level: str = "ERROR",
        env: Mapping[str, str | None] | None = None,
    ) -> None:
        self.run, self.out = run, Path(out)
        (self.out / "deliveries").mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "tests.chaos.driver", "--run", run, "--dir", str(out),
               "--checkpoint", str(checkpoint), "--master", master, "--format", fmt,
               "--log-level", log_level]
        if db is not None:
            cmd += ["--db", str(db)]
        if event_log is not None:
            cmd += ["--event-log", str(event_log)]
        for key, value in options.items():
            cmd += ["--option", f"{key}={value}"]
        child_env = {**os.environ, "KDDB_CHAOS_DIR": str(out), "KDDB_CHAOS_RUN": run}
        for key, value in (env or {}).items():
            if value is None:
                child_env.pop(key, None)
            else:
                child_env[key] = value
        self.log_path = self.out / f"{run}.log"
        self._log = open(self.log_path, "wb")
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, env=child_env,
            cwd=Path(__file__).resolve().parents[2],
        )

    # -- observing -------------------------------------------------------------------------

    def started(self) -> bool:
        return (self.out / f"{self.run}.started").exists()

    def paused(self) -> str | None:
        marker = self.out / f"{self.run}.paused"
        return marker.read_text() if marker.exists() else None

    def failed(self) -> str | None:
        """The tail of the log if the process exited by itself."""
        if self.proc.poll() is None:
            return None
        return self.log_path.read_bytes()[-4000:].decode(errors="replace")

    def error(self) -> str | None:
        path = self.out / f"{self.run}.error.txt"
        return path.read_text() if path.exists() else None

    def check_alive(self) -> bool:
        """True while running; raises with the log tail if the driver died by itself."""
        tail = self.failed()
        if tail is not None:
            raise AssertionError(f"driver {self.run} exited by itself ({self.proc.returncode}):\n{tail}")
        return True

    def phase_now(self) -> str:
        """The phase the run is in, from its phase log: the innermost one entered and not left
        (``sink`` before ``committing`` before ``reading`` ...), else ``between-batches``, or
        ``startup`` if the source was never called."""
        path = self.out / f"{self.run}.phases"
        if not path.exists():
            return "startup"
        open_phases: dict[tuple[str, str], int] = {}
        for line in path.read_text().splitlines():
            parts = line.split(" ", 4)
            if len(parts) < 4:
                continue
            _, pid, phase, event = parts[:4]
            key = (pid, phase)
            if event == "enter":
                open_phases[key] = open_phases.get(key, 0) + 1
            elif event == "exit":
                open_phases[key] = max(0, open_phases.get(key, 0) - 1)
            elif event == "worker-killed":
                open_phases.pop(key, None)
        active = {phase for (_, phase), n in open_phases.items() if n > 0}
        for phase in _PRIORITY:
            if phase in active:
                return phase
        return "between-batches"

    # -- acting ----------------------------------------------------------------------------

    def pause_at(self, phase: str) -> None:
        (self.out / f"pause-{self.run}-{phase}").write_text("")

    def kill_worker_once(self) -> None:
        (self.out / f"killworker-{self.run}").write_text("")

    def kill(self) -> None:
        """SIGKILL the driver and everything it started."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)
        self._log.close()

    def wait_exit(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        self._log.close()
        return code


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--master", default="local[2,4]")
    parser.add_argument("--format", default=CHAOS_FORMAT)
    parser.add_argument("--db")
    parser.add_argument("--event-log")
    parser.add_argument("--log-level", default="ERROR")
    parser.add_argument("--option", action="append", default=[], help="key=value")
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    import logging

    logging.basicConfig(level=args.log_level if args.log_level != "ALL" else "DEBUG",
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from pyspark.sql import SparkSession

    from kinesis_source import register
    from tests.chaos.chaos_source import register_chaos
    from tests.chaos.recipe import write_exactly_once

    builder = (
        SparkSession.builder.master(args.master)
        .appName(f"kinesis-ddb-chaos-{args.run}")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
    )
    if args.master.startswith("local-cluster"):
        for key in ("KDDB_CHAOS_DIR", "KDDB_CHAOS_RUN", "PYTHONPATH", "PYSPARK_PYTHON",
                    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
            if key in os.environ:
                builder = builder.config(f"spark.executorEnv.{key}", os.environ[key])
    if args.event_log:
        builder = (
            builder.config("spark.eventLog.enabled", "true")
            .config("spark.eventLog.dir", args.event_log)
            .config("spark.eventLog.compress", "false")  # plain JSON lines, for grep
            .config("spark.eventLog.rolling.enabled", "false")
        )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(args.log_level)
    register(spark)
    register_chaos(spark)
    out = Path(args.dir)
    db = Path(args.db) if args.db else None

    def sink(df, batch_id):
        rows = [
            (r["streamName"], r["shardId"], r["sequenceNumber"], r["subSequenceNumber"], bytes(r["data"]).decode())
            for r in df.collect()
        ]
        if not rows:
            return
        note("sink", "enter", str(batch_id))
        final = out / "deliveries" / f"{args.run}-{batch_id:06d}.json"
        tmp = final.with_suffix(".tmp")
        tmp.write_text(json.dumps({"run": args.run, "batch": batch_id, "rows": rows}))
        tmp.replace(final)
        pause_point("sink-before-db")
        if db is not None:
            write_exactly_once(db, rows, args.run, batch_id)
        pause_point("sink-after-db")
        note("sink", "exit", str(batch_id))

    reader = spark.readStream.format(args.format)
    for pair in args.option:
        key, _, value = pair.partition("=")
        reader = reader.option(key, value)
    query = (
        reader.load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime="250 milliseconds")
        .start()
    )
    (out / f"{args.run}.started").write_text("")
    explained = False
    progress_file = out / f"{args.run}.progress.jsonl"
    try:
        while not query.awaitTermination(1):
            recent = query.recentProgress
            if recent:
                tmp = progress_file.with_suffix(".tmp")
                tmp.write_text("".join(json.dumps(p, default=str) + "\n" for p in recent))
                tmp.replace(progress_file)
            if not explained and query.lastProgress is not None:
                query.explain(extended=True)  # the plan goes to the log the secrets test greps
                explained = True
    except Exception as exc:  # noqa: BLE001 - reported to the test through a file
        (out / f"{args.run}.error.txt").write_text(str(exc))
        sys.stdout.flush()
        os._exit(3)


if __name__ == "__main__":
    main()
