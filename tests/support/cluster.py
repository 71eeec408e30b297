"""A Spark standalone cluster of several hosts on one machine, for the multi-host tests.

Each host is a network namespace this module makes and removes itself: a private bridge of its
own (a /24 of 10.231.0.0/16 that no interface of the machine uses), one veth pair per host, the
machine's side of the bridge holding ``.1`` (the test process reaches the hosts through it).
Nothing outside these addresses and loopback is ever addressed.

- ``aws``: the AWS servers (moto), listening on the host's address;
- ``master``: Spark's standalone master (``spark-class org.apache.spark.deploy.master.Master``,
  the launcher PySpark's wheel ships);
- ``w1``, ``w2`` (``workers``): one Spark worker each, 1 core;
- ``driver``: where a test runs its query's driver, in client mode.

A host can be cut off (its link down) and restored, take a second address, or lose its route
to one address (failing at once, or unanswered as behind a dropping firewall). Needs root and
``ip``; :func:`unavailable` says why not, for a skip message.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.waiting import wait_for

MASTER_PORT = 7077
MASTER_UI_PORT = 8080
WORKER_UI_PORT = 8081


def unavailable() -> str | None:
    """Why this machine cannot make the cluster's hosts (None: it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is missing"
    probe = f"kddb-probe-{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    argv = ["ip", "netns", "exec", ns, "ip", *args] if ns else ["ip", *args]
    return subprocess.run(argv, capture_output=True, text=True, check=check)


def _free_subnet() -> int:
    """A third octet n such that no interface uses 10.231.n.0/24."""
    used = _ip("-o", "-4", "addr", "show").stdout
    for n in range(10, 250):
        if f" 10.231.{n}." not in used:
            return n
    raise RuntimeError("no free 10.231.n.0/24 for the test cluster")


@dataclass
class Host:
    """One namespace with one address."""

    name: str
    ns: str
    address: str
    veth: str  # the machine's end of its veth pair (on the bridge)
    processes: list[subprocess.Popen] = field(default_factory=list)

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host."""
        return ["ip", "netns", "exec", self.ns, *argv]

    def start(self, argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
        """A process on this host, in a process group of its own, logging to ``log``; without
        this process's ``PYTHONPATH`` (the test run's, which finds this repository): what a
        host's Python has is its own interpreter's."""
        base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        with open(log, "ab") as out:
            proc = subprocess.Popen(self.argv(argv), stdout=out, stderr=subprocess.STDOUT,
                                    env={**base, **(env or {})}, start_new_session=True)
        self.processes.append(proc)
        return proc

    def kill_all(self) -> None:
        """SIGKILL every process started here (their groups: JVMs and their children)."""
        for proc in self.processes:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=30)
        self.processes.clear()

    def cut(self) -> None:
        """The host's link goes down: nothing reaches it, it reaches nothing."""
        _ip("link", "set", self.veth, "down")

    def restore(self) -> None:
        """The host's link comes back."""
        _ip("link", "set", self.veth, "up")

    def add_address(self, address: str) -> None:
        """A second address on this host's interface (in the cluster's /24)."""
        _ip("addr", "add", f"{address}/24", "dev", f"{self.veth}p", ns=self.ns)

    def remove_address(self, address: str) -> None:
        """:meth:`add_address` undone."""
        _ip("addr", "del", f"{address}/24", "dev", f"{self.veth}p", ns=self.ns)

    def blackhole(self, address: str, via: str) -> None:
        """This host's packets to ``address`` go to ``via``, an address no host has: its
        connections there get no answer (the kernel gives up on the next hop after about 3 s),
        as behind a firewall that drops them (this kernel has no packet filter to do it with:
        no ``tc`` actions, no ``iptables``)."""
        _ip("route", "add", f"{address}/32", "via", via, ns=self.ns)

    def unroute(self, address: str) -> None:
        """This host cannot reach ``address`` (an unreachable route): its calls there fail at
        once, everything else still flows."""
        _ip("route", "add", "unreachable", f"{address}/32", ns=self.ns)

    def reroute(self, address: str) -> None:
        """:meth:`unroute` or :meth:`blackhole` undone."""
        _ip("route", "del", f"{address}/32", ns=self.ns)


def _spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


class Cluster:
    """``with Cluster(tmp) as c:`` the hosts are up, the master and workers running."""

    def __init__(self, workdir: Path, workers: int = 2, python: str | None = None) -> None:
        self.workdir = Path(workdir)
        # the workers' own interpreter, used where an application names none
        self.python = python or sys.executable
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._tag = uuid.uuid4().hex[:5]
        self._bridge = f"kbr{self._tag}"
        self._net = 0  # chosen with the network, under a lock: two clusters never share a /24
        names = ["aws", "master", *(f"w{i + 1}" for i in range(workers)), "driver"]
        # addresses are given once the network is chosen (:meth:`_network`)
        self.hosts = {name: Host(name, f"kddb-{self._tag}-{name}", "", f"kv{self._tag}{i}")
                      for i, name in enumerate(names)}

    @property
    def gateway(self) -> str:
        """The machine's address on the bridge (the test process's servers listen there)."""
        return f"10.231.{self._net}.1"

    @property
    def master_url(self) -> str:
        """``spark://<master's address>:7077``."""
        return f"spark://{self.hosts['master'].address}:{MASTER_PORT}"

    def spare_address(self, k: int) -> str:
        """An address of the hosts' /24 no host holds until one is given it (``k`` < 40)."""
        return f"10.231.{self._net}.{200 + k}"

    @property
    def nowhere(self) -> str:
        """An address of the hosts' /24 that no host ever holds (a next hop that never answers)."""
        return f"10.231.{self._net}.250"

    @property
    def workers(self) -> list[Host]:
        """The worker hosts."""
        return [h for n, h in self.hosts.items() if n.startswith("w")]

    def __enter__(self) -> Cluster:
        try:
            self._network()
            self._spark()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _network(self) -> None:
        with open(Path(tempfile.gettempdir()) / "kddb-cluster-net.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._net = _free_subnet()
            for i, host in enumerate(self.hosts.values()):
                host.address = f"10.231.{self._net}.{10 + i}"
            _ip("link", "add", self._bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/24", "dev", self._bridge)
        self._hosts_up()

    def _hosts_up(self) -> None:
        _ip("link", "set", self._bridge, "up")
        for host in self.hosts.values():
            _ip("netns", "add", host.ns)
            inner = f"{host.veth}p"
            _ip("link", "add", host.veth, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", host.ns)
            _ip("link", "set", host.veth, "master", self._bridge)
            _ip("link", "set", host.veth, "up")
            _ip("addr", "add", f"{host.address}/24", "dev", inner, ns=host.ns)
            _ip("link", "set", inner, "up", ns=host.ns)
            _ip("link", "set", "lo", "up", ns=host.ns)

    def spark_env(self, host: Host, python: str | None = None) -> dict[str, str]:
        """What a Spark process on ``host`` needs: its own address, its Python (``python``, else
        the cluster's)."""
        return {"SPARK_LOCAL_IP": host.address, "SPARK_LOCAL_HOSTNAME": host.address,
                "PYSPARK_PYTHON": python or self.python, "SPARK_WORKER_DIR": str(self.workdir / f"{host.name}-work"),
                "SPARK_LOG_DIR": str(self.workdir)}

    def _spark(self) -> None:
        master = self.hosts["master"]
        master.start([_spark_class(), "org.apache.spark.deploy.master.Master", "--host", master.address,
                      "--port", str(MASTER_PORT), "--webui-port", str(MASTER_UI_PORT)],
                     self.workdir / "master.log", self.spark_env(master))
        for worker in self.workers:
            self.start_worker(worker, wait=False)
        wait_for(lambda: self.alive_workers() == len(self.workers), timeout=120,
                 what=lambda: f"{len(self.workers)} Spark workers registered (master log: "
                              f"{self.workdir / 'master.log'})")

    def start_worker(self, worker: Host, wait: bool = True) -> None:
        """A Spark worker on ``worker`` (again, after its host was killed): 1 core, 1 GiB; with
        ``wait``, until the master lists every worker alive."""
        worker.start([_spark_class(), "org.apache.spark.deploy.worker.Worker", "--host", worker.address,
                      "--cores", "1", "--memory", "1g", "--webui-port", str(WORKER_UI_PORT), self.master_url],
                     self.workdir / f"{worker.name}.log", self.spark_env(worker))
        if wait:
            wait_for(lambda: self.alive_workers() == len(self.workers), timeout=120,
                     what=f"the worker on {worker.name} registered again")

    def alive_workers(self) -> int:
        """Workers the master lists as ALIVE (its UI's JSON)."""
        url = f"http://{self.hosts['master'].address}:{MASTER_UI_PORT}/json/"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                state = json.load(resp)
        except OSError:
            return 0
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def close(self) -> None:
        """Stop every process and remove every namespace, veth and the bridge made here."""
        for host in self.hosts.values():
            host.kill_all()
        for host in self.hosts.values():
            # anything still inside (a test's process that outlived it) goes with its host
            pids = subprocess.run(["ip", "netns", "pids", host.ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _ip("netns", "del", host.ns, check=False)
            _ip("link", "del", host.veth, check=False)
        _ip("link", "del", self._bridge, check=False)


def main() -> None:
    """``./dev cluster``: make a cluster with moto on its aws host, print how to reach it, and
    keep it until Ctrl-C (then remove every namespace and the bridge)."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description="a Spark standalone cluster of namespace hosts")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    why = unavailable()
    if why is not None:
        raise SystemExit(f"cannot make the cluster here: {why}")
    with Cluster(Path(tempfile.mkdtemp(prefix="kddb-cluster-")), args.workers) as made:
        aws = made.hosts["aws"]
        aws.start([sys.executable, "-m", "moto.server", "-H", aws.address, "-p", "5000"], made.workdir / "moto.log")
        driver = made.hosts["driver"]
        print(f"master {made.master_url} (UI http://{made.hosts['master'].address}:{MASTER_UI_PORT}); "
              f"AWS (moto) http://{aws.address}:5000; logs in {made.workdir}")
        print(f"a driver in client mode: sudo {' '.join(driver.argv(['bash']))}, then "
              f"SPARK_LOCAL_IP={driver.address} pyspark --master {made.master_url}")
        print("Ctrl-C removes the cluster", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
