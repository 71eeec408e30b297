"""The environments the install-route tests run in, as on a fresh machine: ``.venv-clean``
(``./dev`` makes it: the dependencies, not the package), a wheel built as docs/quickstart.md
says, and a new environment with that wheel installed; and how their processes are run (no
``PYTHONPATH``, no ``PYSPARK_*``, none of this repository's environments on ``PATH``)."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
