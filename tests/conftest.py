"""Shared fixtures: one moto server, one kinesis-local and one local[2] SparkSession per test
process (``./dev test`` runs several with pytest-xdist), and the order the tests run in."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import uuid
from pathlib import Path

import boto3
import pytest

from kinesis_source.tools.local import LOCAL_CREDENTIALS, LocalEndpoint
from tests.support.kinesis_local import KinesisLocal
from tests.support.quota import FAST_PLANNING
from tests.support.waiting import wait_for

# Spark's helper and worker processes inherit the environment of this process: they must run
# this interpreter (it has the package) and stay on loopback.
os.environ.update(LOCAL_CREDENTIALS)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Spark's helper imports tests.support.callbacks (the onCommit option) from the repository root,
# and that callback writes where the tests read.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p
)
# Each test process its own (a worker inherits the first process's environment): the file names
# in it are fixed (credentials-lasting.jsonl) or per application.
if "PYTEST_XDIST_WORKER" in os.environ or "KDDB_TEST_CALLBACK_DIR" not in os.environ:
    os.environ["KDDB_TEST_CALLBACK_DIR"] = tempfile.mkdtemp(prefix="kddb-callbacks-")


BACKENDS = ["moto", "kinesis-local"]


def pytest_configure(config):
    config.addinivalue_line("markers", "backends(*names): Kinesis implementations a test runs on")


# Seconds each slow test took in a full run (tests/durations.json); refresh with
# `python -m tests.support.durations <junit.xml>` when they change much. Only the order uses them.
DURATIONS = Path(__file__).with_name("durations.json")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Drop the parametrizations of tests marked for other Kinesis backends; then order the
    rest longest first (after pytest grouped them by their fixtures' parameters): xdist's
    ``loadgroup`` scheduler deals the first tests out in turn (after its one group, the
    cluster's), so the long ones start at once on every worker and the short ones fill the
    end, instead of one long test at the end keeping one worker busy alone. A serial run keeps the same order."""
    keep, drop = [], []
    for item in items:
        marker = item.get_closest_marker("backends")
        backend = getattr(item, "callspec", None) and item.callspec.params.get("kinesis_backend")
        (drop if marker and backend and backend not in marker.args else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    items.sort(key=lambda item: -known.get(item.nodeid, 0.0))


@pytest.fixture(scope="session")
def endpoint():
    """A moto server on a free 127.0.0.1 port for the whole session (DynamoDB, and Kinesis for
    the moto backend)."""
    with LocalEndpoint() as ep:
        yield ep


@pytest.fixture(scope="session")
def kinesis_local():
    """A kinesis-local server for the whole session, started when a test first needs it (not
    a parameter of ``kinesis_backend``: tests run longest first, the backends interleaved, and
    a parametrized fixture would restart the server at each switch)."""
    with KinesisLocal() as server:
        yield server.url


@pytest.fixture(scope="session", params=BACKENDS)
def kinesis_backend(request, endpoint):
    """The Kinesis implementation under test: moto server or kinesis-local; its URL."""
    return endpoint.url if request.param == "moto" else request.getfixturevalue("kinesis_local")


@pytest.fixture(scope="session")
def ddb(endpoint):
    """A boto3 DynamoDB client on the moto server."""
    return boto3.client("dynamodb", endpoint_url=endpoint.url, region_name="us-east-1")


@pytest.fixture(scope="session")
def kinesis(kinesis_backend):
    """A boto3 Kinesis client on the backend under test."""
    return boto3.client("kinesis", endpoint_url=kinesis_backend, region_name="us-east-1")


@pytest.fixture
def make_stream(kinesis):
    """Create a uniquely named stream and wait until it is ACTIVE."""

    def make(shards: int = 4) -> str:
        name = f"t-{uuid.uuid4().hex[:10]}"
        kinesis.create_stream(StreamName=name, ShardCount=shards)
        wait_for(
            lambda: kinesis.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"][
                "StreamStatus"
            ]
            == "ACTIVE",
            timeout=30,
            what=f"stream {name} ACTIVE",
        )
        return name

    return make


@pytest.fixture(scope="session")
def spark():
    """A real local[2] SparkSession with kinesis-ddb registered."""
    from pyspark.sql import SparkSession

    from kinesis_source import register

    session = (
        SparkSession.builder.master("local[2]")
        .appName("kinesis-ddb-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.noDataProgressEventInterval", "100")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    register(session)
    yield session
    session.stop()


@pytest.fixture
def source_options(endpoint, kinesis_backend):
    """Options every test query needs to reach the local endpoints."""
    return {
        "applicationName": f"app-{uuid.uuid4().hex[:10]}",
        "dynamodbEndpointUrl": endpoint.url,
        "endpointUrl": kinesis_backend,
        "region": "us-east-1",
        "awsAccessKeyId": "local",
        "awsSecretKey": "local",
        "tipReportHost": "127.0.0.1",  # the driver's report listener, like every test server
        **FAST_PLANNING,  # tests of the call budget itself drop these (as_users_run)
    }
