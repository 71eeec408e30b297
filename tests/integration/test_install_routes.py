"""Every documented way to run the source, end to end, from an environment that has the
dependencies but not the package (``./dev`` makes ``.venv-clean``), as on a fresh machine:

- docs/quickstart.md "With spark-submit": a wheel built with ``pip wheel . --no-deps``,
  installed into an environment, and ``spark-submit --conf spark.pyspark.python=...``;
- the same page's ``--py-files kinesis_source.zip`` route;
- its local example, run as written with that environment's interpreter, not activated.

Nothing of this repository is on the path of these processes: not the working directory, not
``PYTHONPATH``.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
CLEAN = REPO / ".venv-clean"
APP = REPO / "tests" / "support" / "submit_app.py"


def clean_env(venv: Path | None = None, **extra: str) -> dict[str, str]:
    """This process's environment without what would find the package or pick an interpreter:
    no PYTHONPATH, no PYSPARK_*; PATH without any of this repository's virtualenvs (a user who
    did not activate one), except ``venv``'s when given."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV")}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and not p.startswith(str(REPO))]
    if venv is not None:
        path.insert(0, str(venv / "bin"))
    env["PATH"] = os.pathsep.join(path)
    return {**env, "SPARK_LOCAL_IP": "127.0.0.1", **extra}


def run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def site_packages(venv: Path) -> str:
    out = subprocess.run([str(venv / "bin" / "python"), "-c", "import site; print(site.getsitepackages()[0])"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.fixture(scope="module")
def clean() -> Path:
    assert (CLEAN / "bin" / "python").exists(), "run ./dev setup: it makes .venv-clean"
    return CLEAN


def _once(tmp_path_factory, name: str, make) -> Path:
    """``make(dir)`` run once per test run, whichever test process asks first (the others wait
    for it and share what it made): the wheel is built, and installed, once."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the workers' base directories share this one
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        made, done = root / name, root / f"{name}.done"
        if not done.exists():
            shutil.rmtree(made, ignore_errors=True)
            made.mkdir()
            make(made)
            done.write_text("")
        return made


def _build_wheel(work: Path) -> None:
    built = run([sys.executable, "-m", "pip", "wheel", ".", "-w", str(work), "--no-deps",
                 "--disable-pip-version-check", "--quiet"], REPO, clean_env())
    assert built.returncode == 0, built.stderr[-3000:]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel ``pip wheel . -w dist/ --no-deps`` builds, as docs/quickstart.md says."""
    (path,) = _once(tmp_path_factory, "dist", _build_wheel).glob("kinesis_ddb-*.whl")
    return path


@pytest.fixture(scope="module")
def wheel_env(clean, wheel, tmp_path_factory) -> Path:
    """A new environment with the wheel installed as users install it; the dependencies are
    .venv-clean's (a .pth file), so pip has nothing to fetch."""

    def install(work: Path) -> None:
        env = work / "env"
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        Path(site_packages(env), "deps.pth").write_text(site_packages(clean) + "\n")
        installed = run([str(env / "bin" / "python"), "-m", "pip", "install", "--no-deps", "--quiet",
                         "--disable-pip-version-check", str(wheel)], work, clean_env())
        assert installed.returncode == 0, installed.stderr[-3000:]

    return _once(tmp_path_factory, "wheel", install) / "env"


def rows(proc: subprocess.CompletedProcess) -> int:
    found = re.findall(r"^ROWS (\d+)$", proc.stdout, flags=re.M)
    assert proc.returncode == 0 and found, (proc.stdout[-2000:], proc.stderr[-4000:])
    return int(found[-1])


def test_the_wheel_holds_the_package_its_auto_registration_and_its_command(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry = zf.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "pyspark_kinesis_ddb.py" in names and "kinesis_source/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    assert "kinesis_source/source.py" in names
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "docs/"))]
    assert "kinesis-ddb = kinesis_source.tools.cli:main" in entry
    assert "License-Expression: Apache-2.0" in meta and "Classifier: Typing :: Typed" in meta
    from trove_classifiers import classifiers

    ours = re.findall(r"^Classifier: (.+)$", meta, flags=re.M)
    assert ours and not set(ours) - classifiers, set(ours) - classifiers
    assert "Requires-Dist: pyspark>=4.0" in meta and "Provides-Extra: local" in meta


def test_format_works_without_register_from_the_installed_wheel(wheel_env, tmp_path):
    """PySpark's automatic registration finds pyspark_kinesis_ddb in the environment."""
    python = str(wheel_env / "bin" / "python")
    proc = run([python, str(APP), "--auto"], tmp_path, clean_env(PYSPARK_PYTHON=python))
    assert rows(proc) == 50


def test_the_package_is_not_in_the_clean_environment(clean, tmp_path):
    proc = run([str(clean / "bin" / "python"), "-c", "import kinesis_source"], tmp_path, clean_env())
    assert "No module named 'kinesis_source'" in proc.stderr


def test_wheel_and_spark_submit(clean, wheel_env, tmp_path):
    python = str(wheel_env / "bin" / "python")
    version = run([str(wheel_env / "bin" / "kinesis-ddb"), "--version"], tmp_path, clean_env())
    assert version.stdout.startswith("kinesis-ddb "), version.stderr
    # spark-submit from the Spark environment (activated: its python3 lacks the package), told
    # which interpreter has it
    proc = run([str(clean / "bin" / "spark-submit"), "--conf", f"spark.pyspark.python={python}", str(APP)],
               tmp_path, clean_env(clean))
    assert rows(proc) == 50


def test_py_files_zip_and_spark_submit(clean, tmp_path):
    """The zip route: the package reaches the driver, the planning helper and the executors only
    through --py-files (issue 23: the helper did not see it)."""
    archive = tmp_path / "kinesis_source.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in (REPO / "kinesis_source").rglob("*.py"):
            zf.write(path, path.relative_to(REPO))
    python = str(clean / "bin" / "python")
    proc = run([str(clean / "bin" / "spark-submit"), "--py-files", str(archive), str(APP)], tmp_path,
               clean_env(clean, PYSPARK_PYTHON=python))
    assert rows(proc) == 50


def test_quickstart_local_example_runs_as_written(wheel_env, tmp_path):
    """Run with the environment's interpreter by path, not activated: Spark would start
    ``python3`` from PATH for its workers unless the example says otherwise."""
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "quickstart.md").read_text(), flags=re.S)
    (example,) = [b for b in blocks if "LocalEndpoint" in b]
    script = tmp_path / "example.py"
    script.write_text(example)
    proc = run([str(wheel_env / "bin" / "python"), str(script)], tmp_path, clean_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rows: 100" in proc.stdout


def test_the_demo_without_its_extra_says_which_to_install(wheel_env, tmp_path):
    """.venv-clean has the [local] extra, not [demo] (rich)."""
    proc = run([str(wheel_env / "bin" / "kinesis-ddb"), "demo"], tmp_path, clean_env())
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "needs the [demo] extra: pip install 'kinesis-ddb[demo]'" in proc.stderr, proc.stderr


@pytest.fixture
def connect_port():
    """The local Spark Connect server of ``remote("local[2]")`` listens on port 15002 and its
    client looks for it there: one such test at a time across the test processes."""
    with open(os.path.join(tempfile.gettempdir(), "kddb-tests-spark-connect-15002.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield 15002


def test_spark_connect_session_with_register(connect_port, tmp_path):
    """A Spark Connect client (``remote("local[2]")``, pyspark's connect extra) that calls
    ``register(spark)``: the class travels pickled to the server, whose Python workers import
    the package."""
    python = sys.executable
    proc = run([python, str(APP), "--connect"], tmp_path, clean_env(PYSPARK_PYTHON=python))
    assert rows(proc) == 50


def test_spark_connect_client_without_the_package_uses_the_servers(clean, wheel_env, endpoint, connect_port, tmp_path):
    """The client's environment lacks the package; the server's Python (the wheel's
    environment) has it, and PySpark's automatic registration makes the format known there."""
    server_python = str(wheel_env / "bin" / "python")
    proc = run([str(clean / "bin" / "python"), str(APP), "--connect", "--auto", "--endpoint", endpoint.url],
               tmp_path, clean_env(PYSPARK_PYTHON=server_python))
    assert rows(proc) == 50
