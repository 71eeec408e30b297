"""Who uses an EFO consumer (the checkpoint table's ``consumer/...`` items) and what
``deregisterConsumer=true`` makes of it: a consumer is deregistered only by its last user.
DynamoDB is the moto server; the consumers are the EFO test server's."""

from __future__ import annotations

import logging
import uuid

import pytest

from kinesis_source.checkpoints.consumer_users import ConsumerUsers
from kinesis_source.checkpoints.store import CheckpointStore
from kinesis_source.driver.consumers import Consumers
from kinesis_source.options import SourceOptions
from tests.integration.test_efo_spark import consumers_of, server_client
from tests.support.efo_server import EfoServer
from tests.support.waiting import wait_for

pytestmark = pytest.mark.backends("moto")


@pytest.fixture(autouse=True)
def sigterm_kept():
    """``Consumers`` handles SIGTERM as the planner process must; not this process's."""
    import signal

    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


@pytest.fixture
def table(ddb):
    name = f"users-{uuid.uuid4().hex[:8]}"
    CheckpointStore(ddb, name, "any").ensure_table(create=True)
    return name


def test_a_run_leaves_only_while_no_newer_run_of_its_application_joined(ddb, table):
    users = ConsumerUsers(ddb, table, "arn:aws:kinesis:us-east-1:1:stream/s", "shared")
    users.join("app-a", 5, "host-1")
    users.join("app-b", 1, "host-2")
    users.join("app-a", 6, "host-3")  # a newer run of app-a fenced run 5
    assert users.leave("app-a", 5) is False
    assert sorted((u.application, u.epoch, u.host) for u in users.users()) == [
        ("app-a", 6, "host-3"), ("app-b", 1, "host-2")]
    assert users.leave("app-a", 6) is True
    assert [u.application for u in users.users()] == ["app-b"]
    # the items live in the consumer's own partition: no application's rows are touched
    assert ConsumerUsers(ddb, table, "arn:aws:kinesis:us-east-1:1:stream/s", "other").users() == []


class Claimed:
    """An application as a run holds it after its claim (what ``Consumers`` asks of one)."""

    def __init__(self, ddb, table, name):
        self.store = CheckpointStore(ddb, table, name)
        self.epoch = None

    def claim(self):
        if self.epoch is None:
            self.epoch = self.store.claim("test", "host").epoch
        return self.epoch


def test_two_applications_sharing_a_consumer_name_are_warned_and_the_last_deregisters(
    kinesis_backend, make_stream, endpoint, ddb, table, caplog
):
    stream = make_stream(1)
    with EfoServer(kinesis_backend, activation_delay_s=0.1) as server:
        def run(app):
            opts = SourceOptions.parse({
                "streamName": stream, "applicationName": app, "consumerMode": "efo",
                "consumerName": "shared", "deregisterConsumer": "true", "checkpointTable": table,
                "endpointUrl": server.url, "dynamodbEndpointUrl": endpoint.url,
                "region": "us-east-1", "awsAccessKeyId": "local", "awsSecretKey": "local",
            })
            return Consumers(opts, Claimed(ddb, table, app))

        first, second = run("app-a"), run("app-b")
        caplog.set_level(logging.WARNING, logger="kinesis_source.driver.consumers")
        arn = first.arns()[stream]
        assert not caplog.records
        assert second.arns()[stream] == arn
        assert "is also used by application 'app-a'" in caplog.text
        caplog.clear()

        first.release()
        assert "not deregistering EFO consumer 'shared'" in caplog.text
        assert "application 'app-b'" in caplog.text
        client = server_client(server.url)
        assert [c["ConsumerARN"] for c in consumers_of(client, stream)] == [arn]

        second.release()
        wait_for(lambda: not consumers_of(client, stream), timeout=30,
                 what="the last user to deregister the consumer")


PLANNER = """
import sys
from kinesis_source.checkpoints.store import CheckpointStore
from kinesis_source.driver.consumers import Consumers
from kinesis_source.options import SourceOptions
import boto3, json

opts = SourceOptions.parse(json.loads(sys.argv[1]))
ddb = boto3.client("dynamodb", endpoint_url=opts.dynamodb_endpoint_url, region_name="us-east-1",
                   aws_access_key_id="local", aws_secret_access_key="local")

class Claimed:
    store = CheckpointStore(ddb, opts.checkpoint_table, opts.application_name)
    epoch = None
    def claim(self):
        self.epoch = self.epoch or self.store.claim("test", "host").epoch
        return self.epoch

print("registering", flush=True)
Consumers(opts, Claimed()).arns()
print("active", flush=True)
"""


@pytest.mark.parametrize("refused", [False, True], ids=["deregistered-creating", "refused-until-active"])
def test_a_run_stopped_while_its_consumer_is_creating_deregisters_it(
    refused, kinesis_backend, make_stream, endpoint, table
):
    """Spark stops a query by SIGTERM to its planner process: one stopped while waiting for its
    new consumer to become ACTIVE must not leave it registered (and billed), also where
    Kinesis refuses to deregister a consumer until it is ACTIVE."""
    import json
    import signal
    import subprocess
    import sys

    stream = make_stream(1)
    with EfoServer(kinesis_backend, activation_delay_s=3 if refused else 120) as server:
        server.refuse_deregistering_creating = refused
        client = server_client(server.url)
        opts = {
            "streamName": stream, "applicationName": "creating", "consumerMode": "efo",
            "deregisterConsumer": "true", "checkpointTable": table, "endpointUrl": server.url,
            "dynamodbEndpointUrl": endpoint.url, "region": "us-east-1",
            "awsAccessKeyId": "local", "awsSecretKey": "local",
        }
        planner = subprocess.Popen([sys.executable, "-c", PLANNER, json.dumps(opts)],
                                   stdout=subprocess.PIPE, text=True)
        try:
            assert planner.stdout.readline().strip() == "registering"
            wait_for(lambda: [c["ConsumerStatus"] for c in consumers_of(client, stream)] == ["CREATING"],
                     timeout=30, what="the consumer to be CREATING")
            planner.send_signal(signal.SIGTERM)
            assert planner.wait(timeout=30) == 128 + signal.SIGTERM
        finally:
            planner.kill()
        wait_for(lambda: not consumers_of(client, stream), timeout=30,
                 what="the CREATING consumer to be deregistered")
