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
import sys
import tempfile
import zipfile

import pytest

from tests.support.install import APP, REPO, clean_env, rows, run

pytestmark = pytest.mark.spark


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
