"""On a Spark standalone cluster of several hosts (network namespaces made by the test run:
``tests/support/cluster.py``): the AWS servers on a host of their own (kinesis-local for Kinesis,
moto for DynamoDB), a master, two workers, and the driver in client mode on another host. Every
Kinesis call goes through a quota-enforcing server (``QuotaProxy``, on the bridge's address) that
counts them per shard. Skipped, saying why, where the machine cannot make namespaces.

Each scenario checks every record once (per shard and per partition key in order), the query
alive through faults Spark can retry, and what its progress reports say about tip reports."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
import uuid
import zipfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest

from tests.support.cluster import Cluster, unavailable
from tests.support.cluster_app import put_round
from tests.support.install import APP, clean_env, rows, run
from tests.support.kinesis_local import KinesisLocal
from tests.support.quota import QuotaProxy
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
WHY_NOT = unavailable()
# one cluster at a time: every test of the module on one test process (``--dist loadgroup``)
pytestmark = [pytest.mark.skipif(WHY_NOT is not None, reason=f"no multi-host cluster here: {WHY_NOT}"),
              pytest.mark.backends("kinesis-local"), pytest.mark.xdist_group("cluster")]
MOTO_PORT = 5000
DRIVER_PORT, BLOCK_MANAGER_PORT = 7078, 7079  # the driver's Spark ports, fixed
DRIVER_TIMEOUT_S = 360  # a run's own limit, Spark's start included
# The long form (opt-in): each fault of the chaos and kill tests this many times in their run.
ROUNDS = int(os.environ.get("KDDB_CLUSTER_ROUNDS", "1"))


@dataclass
class Setup:
    """The cluster and its AWS: ``kinesis_url`` is the quota server's (what queries use)."""

    cluster: Cluster
    quota: QuotaProxy
    kinesis_url: str
    dynamodb_url: str

    def kinesis(self):
        """A boto3 client of kinesis-local itself (not counted by the quota server)."""
        return boto3.client("kinesis", endpoint_url=self.kinesis_url, region_name="us-east-1",
                            aws_access_key_id="tests", aws_secret_access_key="local")

    def options(self, stream: str, **more: str) -> dict[str, str]:
        """A query's options as users run them (default planning and budgets)."""
        return {"streamName": stream, "applicationName": f"app-{stream}", "region": "us-east-1",
                "endpointUrl": self.quota.url, "dynamodbEndpointUrl": self.dynamodb_url,
                "awsAccessKeyId": "local", "awsSecretKey": "local", "initialPosition": "TRIM_HORIZON", **more}


@pytest.fixture(scope="module")
def setup(tmp_path_factory, clean) -> Iterator[Setup]:
    # the hosts' own Python has the dependencies, not the package: an application brings it
    # (cluster_app.py's driver names this project's interpreter; the install routes their own)
    with Cluster(tmp_path_factory.mktemp("cluster"), python=str(clean / "bin" / "python")) as made:
        aws = made.hosts["aws"]
        aws.start([sys.executable, "-m", "moto.server", "-H", aws.address, "-p", str(MOTO_PORT)],
                  made.workdir / "moto.log")
        moto = f"http://{aws.address}:{MOTO_PORT}"
        wait_for(lambda: _answers(f"{moto}/moto-api/"), timeout=60, what="moto on the aws host")
        with KinesisLocal(host=aws.address, prefix=tuple(aws.argv([]))) as kinesis, \
                QuotaProxy(kinesis.url, host=made.gateway) as quota:
            yield Setup(made, quota, kinesis.url, moto)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


class DriverRun:
    """``tests/support/cluster_app.py`` on the driver host, watched: ``distinct`` follows its
    ``BATCH`` lines, so a test can inject a fault mid-run; :meth:`result` is its JSON line."""

    def __init__(self, setup: Setup, options: dict[str, str], expect: int, checkpoint: Path, *args: str) -> None:
        driver = setup.cluster.hosts["driver"]
        argv = [sys.executable, "-m", "tests.support.cluster_app", "--master", setup.cluster.master_url,
                "--driver-host", driver.address, "--expect", str(expect), "--checkpoint", str(checkpoint),
                "--conf", f"spark.driver.port={DRIVER_PORT}",
                "--conf", f"spark.driver.blockManager.port={BLOCK_MANAGER_PORT}", *args]
        for key, value in options.items():
            argv += ["--option", f"{key}={value}"]
        env = dict(os.environ)
        env.update(setup.cluster.spark_env(driver, python=sys.executable), PYTHONPATH=str(ROOT))
        # as on a host whose name resolves to loopback (this machine's /etc/hosts): the report
        # listener's default address is then the driver host's interface, found by the source
        for key in ("SPARK_LOCAL_IP", "SPARK_LOCAL_HOSTNAME"):
            env.pop(key)
        self._log = open(checkpoint.parent / f"driver-{checkpoint.name}.log", "w")  # noqa: SIM115
        self.log_path = Path(self._log.name)
        self._proc = subprocess.Popen(driver.argv([*argv, "--timeout", str(DRIVER_TIMEOUT_S)]), cwd=ROOT, env=env,
                                      stdout=subprocess.PIPE, stdin=subprocess.PIPE, stderr=self._log, text=True,
                                      start_new_session=True)
        RUNNING.append(self)
        self.distinct = 0
        self.first_batch_at: float | None = None
        self.out: dict | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.startswith("BATCH "):
                self.distinct = int(line.split()[2])
                self.first_batch_at = self.first_batch_at or time.monotonic()
            elif line.startswith("{"):
                self.out = json.loads(line)

    def put(self, kinesis, stream: str, rounds: int, tag: str, pad: int = 0) -> list[tuple[str, str, str]]:
        """:func:`put` while the run reads, the run told first to read those too."""
        assert self._proc.stdin is not None
        self._proc.stdin.write(f"MORE {50 * rounds}\n")
        self._proc.stdin.flush()
        sent = put(kinesis, stream, rounds, tag, pad)
        assert len(sent) == 50 * rounds
        return sent

    def wait_rows(self, n: int, timeout: float = 240) -> None:
        """Until the sink holds ``n`` distinct records."""
        wait_for(lambda: self.distinct >= n or self._proc.poll() is not None, timeout=timeout,
                 what=lambda: f"{n} records in the sink (have {self.distinct}; log {self.log_path})")
        assert self._proc.poll() is None, f"the driver ended early: {self.log_path.read_text()[-3000:]}"

    def kill(self) -> None:
        """The driver and everything it started (its process group), if still running."""
        if self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=30)

    def result(self, timeout: float = DRIVER_TIMEOUT_S + 120) -> dict:
        """The driver's JSON line, once it exited cleanly (told first that the test puts no
        more records)."""
        assert self._proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self._proc.stdin.write("END\n")
            self._proc.stdin.close()
        code = self._proc.wait(timeout=timeout)
        self._reader.join(timeout=30)
        self._log.close()
        assert code == 0 and self.out is not None, f"the driver failed ({code}):\n{self.log_path.read_text()[-4000:]}"
        summary = {k: v for k, v in self.out.items() if k not in ("rows", "sent", "reports")}
        summary["rows"] = len(self.out["rows"])
        self.log_path.with_suffix(".json").write_text(json.dumps(summary, indent=1))  # for the docs' figures
        assert self.out["error"] is None, self.out["error"]
        return self.out


RUNNING: list[DriverRun] = []


@pytest.fixture(autouse=True)
def _no_driver_left():
    """A test that failed mid-run leaves no driver holding the cluster's cores and ports."""
    yield
    while RUNNING:
        RUNNING.pop().kill()


def put(kinesis, stream: str, rounds: int, tag: str, pad: int = 0) -> list[tuple[str, str, str]]:
    """``rounds`` of 50 records (``<tag>-<round>-<key>``, then ``|`` and ``pad`` bytes), keys
    ``k0``..``k49``: (shard, sequence number, data)."""
    sent = []
    for n in range(rounds):
        written, refused = put_round(kinesis, stream, tag, n, pad)
        assert not refused, f"kinesis-local refused {refused} records"
        sent += written
    return sent


def new_stream(setup: Setup, shards: int = 2) -> str:
    stream = f"cluster-{uuid.uuid4().hex[:6]}"
    kinesis = setup.kinesis()
    kinesis.create_stream(StreamName=stream, ShardCount=shards)
    kinesis.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 1})
    return stream


def check_rows(out: dict, sent: list[tuple[str, str]], duplicates_allowed: set[tuple[str, str]] = frozenset()):
    """Every record put once (``duplicates_allowed`` may come twice); :func:`check_order`."""
    sent = sorted(set(sent) | {tuple(x) for x in out["sent"]})
    got = [(shard, seq) for shard, seq, *_ in out["rows"]]
    counts = Counter(got)
    assert sorted(counts) == sent, f"lost {len(set(sent) - set(counts))}, unknown {len(set(counts) - set(sent))}"
    twice = {k for k, c in counts.items() if c > 1}
    assert twice <= duplicates_allowed, f"{len(twice - duplicates_allowed)} duplicates outside the batch in flight"
    check_order(out["rows"])


def check_order(rows: list) -> None:
    """One run's rows: each shard's in order, each partition key's in the order put (the data
    ``<tag>-<round>-<key>``) across shards."""
    got = [(shard, seq) for shard, seq, *_ in rows]
    for shard in {s for s, _ in got}:
        mine = [int(q) for s, q in dict.fromkeys(got) if s == shard]
        assert mine == sorted(mine), f"{shard} out of order"
    last: dict[tuple[str, str], int] = {}
    for _, _, data, _ in rows:
        tag, n, key = data.split("|")[0].rsplit("-", 2)
        assert int(n) >= last.get((tag, key), -1), f"key {key}: round {n} after {last[(tag, key)]}"
        last[(tag, key)] = int(n)


def running_on(driver: str, host: str) -> bool:
    """Whether an executor on ``host`` runs a task now (the driver's UI API)."""
    return any(e["hostPort"].startswith(f"{host}:") and e["activeTasks"] > 0 for e in _executors(driver))


def tasks_done_on(driver: str, host: str) -> int:
    """Tasks the executors on ``host`` completed so far (the driver's UI API)."""
    return sum(e["completedTasks"] for e in _executors(driver) if e["hostPort"].startswith(f"{host}:"))


def _executors(driver: str) -> list[dict]:
    base = f"http://{driver}:4040/api/v1/applications"
    try:
        with urllib.request.urlopen(base, timeout=2) as resp:
            (app,) = json.load(resp)
        with urllib.request.urlopen(f"{base}/{app['id']}/executors", timeout=2) as resp:
            return json.load(resp)
    except (OSError, ValueError):
        return []


def budget_held(setup: Setup, stream: str, since: float) -> None:
    """At the quota server: no call refused, and at most the source's 2 of the 5 GetRecords
    per shard per second (driver and executors together) from the first batch on."""
    ours = lambda s: s.shard is not None and s.shard[0] == stream and s.at >= since  # noqa: E731
    assert setup.quota.refused(where=ours) == 0, setup.quota.calls(refused=True, where=ours)[:5]
    assert setup.quota.peak_rate("GetRecords", window_s=10.0, where=ours) <= 2.0


def test_a_query_on_the_cluster_reads_every_record_once_through_a_split_its_tip_reports_crossing_hosts(
    setup, tmp_path
):
    stream = new_stream(setup)
    kinesis = setup.kinesis()
    sent = put(kinesis, stream, 6, "pre")
    run = DriverRun(setup, setup.options(stream), len(sent), tmp_path / "ck", "--produce", "24", "--until-reports")
    run.wait_rows(len(sent))
    parent = kinesis.list_shards(StreamName=stream)["Shards"][0]
    lo, hi = (int(parent["HashKeyRange"][k]) for k in ("StartingHashKey", "EndingHashKey"))
    kinesis.split_shard(StreamName=stream, ShardToSplit=parent["ShardId"], NewStartingHashKey=str((lo + hi) // 2))
    sent += run.put(kinesis, stream, 4, "split")  # into the children (the producer may be done)
    out = run.result()
    check_rows(out, [(s, q) for s, q, _ in sent])
    shards = {s for s, *_ in out["rows"]}
    assert len(shards) == 4, f"the split's children were read: {sorted(shards)}"
    workers = {w.address for w in setup.cluster.workers}
    assert workers <= set(out["executor_hosts"]), out["executor_hosts"]
    # executors (all on the workers' hosts) reached the driver's listener on its host
    assert max(r["tipReports"] for r in out["reports"]) > 0, json.dumps(out["reports"])
    assert max(r["tipReportsRefused"] for r in out["reports"]) == 0
    budget_held(setup, stream, run.first_batch_at)


def test_with_the_report_port_blocked_a_link_cut_and_a_worker_cut_off_from_kinesis_nothing_is_lost(
    setup, tmp_path
):
    """Chaos on the cluster, one fault after another in one run: the driver's report listener
    unreachable from the workers from the start, as behind a firewall that drops its port (the
    listener on a second address of the driver host, ``tipReportHost``, which the workers' routes
    send to an address no host holds): the driver's probes take over, within the budget. Then
    a worker's link cut while it runs a task, and restored (``ROUNDS`` times); then the other
    worker cut off from Kinesis for the rest of the run."""
    cluster = setup.cluster
    stream = new_stream(setup)
    # a backlog the executors read (the driver's probes carry a steady stream's records
    # themselves), so reads are booked whose reports never come
    kinesis = setup.kinesis()
    sent = put(kinesis, stream, 80, "pre", pad=1000)
    driver, (w1, w2) = cluster.hosts["driver"], cluster.workers
    off = w2
    kinesis_at = cluster.gateway  # the quota server's address: every Kinesis call goes there
    listener = cluster.spare_address(1)
    try:
        driver.add_address(listener)
        for worker in cluster.workers:
            worker.blackhole(listener, via=cluster.nowhere)
        # A task on the worker cut off from Kinesis retries its calls maxRetries times (13-26 s
        # of waits at the default 10, under a second at 5) before Spark runs it again, elsewhere
        # with excludeOnFailure (docs/reliability.md says so). The slow transformation keeps
        # tasks running for a while, so the link goes while one runs.
        run = DriverRun(setup, setup.options(stream, tipReportHost=listener, maxRetries="5"), len(sent),
                        tmp_path / "ck", "--produce", "20", "--slow-ms", "10",
                        "--conf", "spark.excludeOnFailure.enabled=true")
        run.wait_rows(len(sent))
        cut = w1
        for n in range(ROUNDS):
            sent += run.put(kinesis, stream, 20, f"cut{n}", pad=1000)
            # whichever worker runs a task first (Spark places tasks as it likes)
            cut = wait_for(lambda: next((w for w in (w1, w2) if running_on(driver.address, w.address)), None),
                           timeout=180, interval=0.05, what="a task running on a worker")
            cut.cut()
            time.sleep(LINK_CUT_S)  # the fault's length, not a wait for something
            cut.restore()
            done = tasks_done_on(driver.address, cut.address)
            wait_for(lambda: tasks_done_on(driver.address, cut.address) > done, timeout=180,  # noqa: B023
                     what=f"{cut.name} completing a task after its link came back")  # noqa: B023
        off = w2 if cut is w1 else w1
        off.unroute(kinesis_at)
        sent += run.put(kinesis, stream, 100, "off", pad=1000)  # past the probes' reach: executors read it
        out = run.result()
    finally:
        for worker in cluster.workers:
            worker.restore()
            _quietly(worker.reroute, kinesis_at)
        for worker in cluster.workers:
            _quietly(worker.reroute, listener)
        _quietly(driver.remove_address, listener)
    check_rows(out, [(s, q) for s, q, _ in sent])
    reports = out["reports"]
    assert max(r["tipReports"] for r in reports) == 0 and reports[-1]["tipReportsMissing"] > 0, out["metrics"]
    budget_held(setup, stream, run.first_batch_at)
    assert out["failed_tasks"].get(off.address, 0) > 0, ("the worker cut off from Kinesis failed no task",
                                                         out["failed_tasks"], out["metrics"])


LINK_CUT_S = 8.0


def _quietly(undo, *args) -> None:
    try:
        undo(*args)
    except subprocess.CalledProcessError:
        pass  # never applied: the run failed before that fault


def test_a_worker_host_killed_mid_run_loses_nothing_and_a_resume_without_the_spark_checkpoint_reads_on(
    setup, tmp_path
):
    """A worker's host killed while a task runs there (``ROUNDS`` times: whichever worker runs
    a task first, as Spark places them; the killed worker started again before the next round);
    then a new run of the same application with a new Spark checkpoint."""
    cluster = setup.cluster
    stream = new_stream(setup)
    kinesis = setup.kinesis()
    sent = put(kinesis, stream, 6, "pre")
    options = setup.options(stream)
    driver = cluster.hosts["driver"]
    # a transformation that takes 5 ms a row: tasks run for seconds, and the host goes mid-task
    run = DriverRun(setup, options, len(sent), tmp_path / "first", "--produce", "20", "--slow-ms", "5")
    run.wait_rows(len(sent))
    killed: list = []
    try:
        for n in range(ROUNDS):
            if killed:
                cluster.start_worker(killed[-1])
            sent += run.put(kinesis, stream, 20, f"kill{n}")
            busy = wait_for(lambda: next((w for w in cluster.workers if running_on(driver.address, w.address)),
                                         None), timeout=180, interval=0.05, what="a task running on a worker")
            busy.kill_all()  # the worker JVM, its executor and Python workers: the host is gone
            killed.append(busy)
        first = run.result()
    finally:
        if killed:
            cluster.start_worker(killed[-1])
    check_rows(first, [(s, q) for s, q, _ in sent])
    lost = sum(first["task_attempts_failed"].get(address, 0) for address in {w.address for w in killed})
    assert lost >= ROUNDS, ("tasks lost with the hosts", first["task_attempts_failed"])
    # a new run of the same application with a new Spark checkpoint resumes from DynamoDB
    more = put(kinesis, stream, 4, "post")
    run = DriverRun(setup, options, len(more), tmp_path / "second", "--produce", "6", "--tag", "again",
                    "--count", "post,again")
    second = run.result()
    assert max(Counter((s, q) for s, q, *_ in second["rows"]).values()) == 1, "a record twice in the second run"
    check_order(second["rows"])
    last_batch = max(b for *_, b in first["rows"])
    in_flight = {(s, q) for s, q, _, b in first["rows"] if b == last_batch}
    both = {"rows": first["rows"] + second["rows"], "sent": first["sent"] + second["sent"]}
    counts = Counter((s, q) for s, q, *_ in both["rows"])
    expected = {(s, q) for s, q, _ in sent + more} | {tuple(x) for x in both["sent"]}
    assert set(counts) == expected, f"lost {len(expected - set(counts))}, unknown {len(set(counts) - expected)}"
    again = {(s, q) for s, q, *_ in second["rows"]} & {(s, q) for s, q, *_ in first["rows"]}
    assert again <= in_flight, "the resume read again only what the first run's last batch held"


def test_fan_out_on_the_cluster_delivers_every_record_once_each_pushed_once(setup, tmp_path):
    """``consumerMode=efo`` (the driver holds each shard's subscription; executors on the
    workers read what it carries): the event-stream server on the bridge's address, in front of
    kinesis-local."""
    from tests.support.efo_server import EfoServer

    stream = new_stream(setup)
    sent = put(setup.kinesis(), stream, 6, "pre")
    with EfoServer(setup.kinesis_url, host=setup.cluster.gateway, activation_delay_s=0.3) as efo:
        options = setup.options(stream, consumerMode="efo", endpointUrl=efo.url)
        out = DriverRun(setup, options, len(sent), tmp_path / "ck", "--produce", "20").result()
        pushed, refused = efo.sent_bytes, dict(efo.refused)
    check_rows(out, [(s, q) for s, q, _ in sent])
    delivered = sum(len(data.encode()) for _, _, data, _ in out["rows"])
    assert pushed == delivered, f"pushed {pushed} B for {delivered} B delivered: a record pushed twice"
    assert refused == {"ResourceInUseException": 0, "LimitExceededException": 0}
    assert out["metrics"]["heldShards"] == 2 and out["metrics"]["executorReadsBooked"] == 0, out["metrics"]


def test_the_sink_on_the_cluster_copies_a_stream_exactly(setup, tmp_path):
    """A query reading one stream and writing another with the ``kinesis-ddb`` sink from the
    workers' executors (``Trigger.AvailableNow``); the copy read back with plain boto3."""
    kinesis = setup.kinesis()
    source, target = new_stream(setup), new_stream(setup, shards=3)
    sent = put(kinesis, source, 24, "copy")
    out = DriverRun(setup, setup.options(source), len(sent), tmp_path / "ck", "--sink-stream", target).result()
    assert out["error"] is None
    copied = []
    for shard in kinesis.list_shards(StreamName=target)["Shards"]:
        iterator = kinesis.get_shard_iterator(StreamName=target, ShardId=shard["ShardId"],
                                              ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while iterator:
            page = kinesis.get_records(ShardIterator=iterator, Limit=10000)
            copied += [(r["PartitionKey"], r["Data"].decode()) for r in page["Records"]]
            iterator = page.get("NextShardIterator") if page["Records"] else None
    assert sorted(d for _, d in copied) == sorted(d for *_, d in sent), "exactly the source's records"
    by_key: dict[str, list[int]] = {}
    for key, data in copied:  # each key's records sit in one target shard, in its order
        by_key.setdefault(key, []).append(int(data.split("|")[0].rsplit("-", 2)[1]))
    assert all(rounds == sorted(rounds) for rounds in by_key.values())
    workers = {w.address for w in setup.cluster.workers}
    assert workers & set(out["executor_hosts"]), out["executor_hosts"]


def submit(setup: Setup, tmp_path: Path, spark_env: Path, *route: str, **env: str) -> dict[str, str]:
    """``tests/support/submit_app.py --where`` with ``spark-submit`` from ``spark_env`` on the
    driver host, in client mode against the cluster's master, on moto (Kinesis and DynamoDB);
    nothing of this repository on the path of its processes. Once it read its 50 rows: where
    each worker host's Python found the package."""
    driver = setup.cluster.hosts["driver"]
    argv = driver.argv([str(spark_env / "bin" / "spark-submit"), "--master", setup.cluster.master_url,
                        "--conf", f"spark.driver.host={driver.address}",
                        "--conf", f"spark.driver.bindAddress={driver.address}",
                        "--conf", "spark.executor.cores=1", "--conf", "spark.cores.max=2", *route,
                        str(APP), "--endpoint", setup.dynamodb_url, "--where"])
    host_env = {k: v for k, v in setup.cluster.spark_env(driver).items() if k != "PYSPARK_PYTHON"}
    proc = run(argv, tmp_path, {**clean_env(spark_env), **host_env, **env})
    assert rows(proc) == 50
    found = dict(line.split()[1:3] for line in proc.stdout.splitlines() if line.startswith("WHERE "))
    assert set(found) == {w.address for w in setup.cluster.workers}, found
    return found


def test_a_wheel_installed_on_every_host_reaches_the_workers_interpreters(setup, wheel_env, clean, tmp_path):
    """docs/quickstart.md's cluster route 1: the wheel installed into an environment at the same
    path on every host (the hosts share this machine's disk), named by spark.pyspark.python."""
    python = wheel_env / "bin" / "python"
    found = submit(setup, tmp_path, clean, "--conf", f"spark.pyspark.python={python}")
    assert all(path.startswith(str(wheel_env)) for path in found.values()), found


def test_py_files_ship_the_package_to_the_workers(setup, clean, tmp_path):
    """Route 2: the package zipped and shipped with --py-files; every host's interpreter
    (.venv-clean's, the dependencies without the package) gets it from Spark."""
    archive = tmp_path / "kinesis_source.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in (ROOT / "kinesis_source").rglob("*.py"):
            zf.write(path, path.relative_to(ROOT))
    python = str(clean / "bin" / "python")
    found = submit(setup, tmp_path, clean, "--py-files", str(archive), PYSPARK_PYTHON=python)
    assert all("kinesis_source.zip" in path for path in found.values()), found


def test_a_packed_environment_in_spark_archives_reaches_the_workers(setup, wheel_env, clean, tmp_path):
    """Route 3: an environment with the wheel, packed into a tar.gz that Spark unpacks on each
    worker (``--archives env.tar.gz#env``, ``spark.pyspark.python=./env/bin/python``). In
    client mode the driver's Python data source process runs that same relative path in the
    driver's working directory, where Spark unpacks nothing: the archive is unpacked there too,
    as docs/quickstart.md says. The environment's dependencies are .venv-clean's by a .pth path
    every host has: what the archive brings is the package."""
    packed = tmp_path / "env.tar.gz"
    with tarfile.open(packed, "w:gz") as tar:
        tar.add(wheel_env, arcname=".")
    with tarfile.open(packed) as tar:
        tar.extractall(tmp_path / "env", filter="tar")
    found = submit(setup, tmp_path, clean, "--archives", f"{packed}#env",
                   "--conf", "spark.pyspark.python=./env/bin/python")
    # each executor's own unpacked copy, in its worker's work directory
    for worker in setup.cluster.workers:
        assert found[worker.address].startswith(str(setup.cluster.workdir / f"{worker.name}-work")), found
