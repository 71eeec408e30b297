"""Enhanced fan-out end to end: real Spark reading through SubscribeToShard from the test EFO
server (tests/support/efo_server.py) in front of each Kinesis backend."""

from __future__ import annotations

import pytest

from tests.integration.test_stream_read import assert_exactly_once_in_order
from tests.support.efo_server import EfoServer
from tests.support.producer import Producer
from tests.support.spark_query import running, source_report
from tests.support.waiting import wait_for

pytestmark = pytest.mark.spark


def rows_of(sink):
    return sorted((r.shard_id, r.seq, r.sub_seq, r.data, r.partition_key) for r in sink.rows())


def consumers_of(kinesis, stream):
    arn = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
    return kinesis.list_stream_consumers(StreamARN=arn).get("Consumers", [])


def test_efo_query_reads_the_same_rows_as_polling_across_resubscriptions(
    spark, kinesis_backend, kinesis, make_stream, source_options, tmp_path
):
    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    producer.put(300)
    with EfoServer(kinesis_backend, activation_delay_s=0.5, page_limit=25) as server:
        server.end_after_events = 3  # every subscription ends early: ranges need several
        efo_client = server_client(server.url)
        options = {
            **source_options,
            "streamName": stream,
            "endpointUrl": server.url,
            "consumerMode": "efo",
            "consumerName": "efo-test",
            "deregisterConsumer": "true",
            "efoSubscriptions": "range",  # (held subscriptions: test_efo_held.py)
        }
        with running(spark, options, tmp_path / "efo") as (query, efo_sink):
            wait_for(lambda: efo_sink.count() >= 300, timeout=120, what="300 rows by EFO")
            producer.put(100)
            wait_for(lambda: efo_sink.count() >= 400, timeout=120, what="400 rows by EFO")
            assert [c["ConsumerName"] for c in consumers_of(efo_client, stream)] == ["efo-test"]
        assert_exactly_once_in_order(efo_sink.rows(), producer.sent)
        ranges = len({(r.shard_id, bid) for bid, rows in efo_sink.deliveries for r in rows})
        assert server.subscriptions > ranges, "no range needed a resubscription"
        # Kinesis' 5 s between a shard's subscriptions (on in the server): the driver holds a
        # shard's next range until then, and a reader waits out its own last one.
        assert server.refused == {"ResourceInUseException": 0, "LimitExceededException": 0}
        # Stopping the query ends its planner process, which deregisters the consumer (on a
        # loaded 2-core machine a CI run once took longer than 60 s for this).
        wait_for(
            lambda: not consumers_of(efo_client, stream), timeout=180,
            what=lambda: "the consumer to be deregistered on stop (DeregisterStreamConsumer "
            f"calls: {server.calls.get('DeregisterStreamConsumer', 0)})",
        )

    # Another application: the EFO query's committed positions must not apply to it.
    polling = {**source_options, "streamName": stream, "applicationName": "poll-" + stream}
    with running(spark, polling, tmp_path / "poll") as (_, poll_sink):
        wait_for(lambda: poll_sink.count() >= 400, timeout=120, what="400 rows by polling")
    assert rows_of(efo_sink) == rows_of(poll_sink)


def server_client(url):
    """A plain boto3 client on the EFO server (its consumer API)."""
    import boto3

    return boto3.client("kinesis", endpoint_url=url, region_name="us-east-1")


@pytest.mark.backends("moto")
def test_cli_deregisters_a_consumer_left_behind(kinesis_backend, make_stream, capsys):
    from kinesis_source.driver import consumers
    from kinesis_source.tools.cli import main

    stream = make_stream(1)
    with EfoServer(kinesis_backend, activation_delay_s=0.1) as server:
        client = server_client(server.url)
        consumers.ensure_consumer(client, stream, "left-behind", timeout_s=30, poll_s=0.1)
        args = ["consumers", "deregister", "--stream", stream, "--name", "left-behind",
                "--endpoint-url", server.url, "--region", "us-east-1"]
        assert main(args) == 0
        assert "deregistered EFO consumer left-behind" in capsys.readouterr().out
        wait_for(lambda: not consumers_of(client, stream), timeout=30, what="consumer gone")
        assert main(args) == 0
        assert "has no EFO consumer left-behind" in capsys.readouterr().out


@pytest.mark.backends("moto")
def test_cli_leaves_a_consumer_a_run_is_recorded_using_unless_forced(kinesis_backend, make_stream, capsys):
    import boto3

    from kinesis_source.checkpoints.consumer_users import ConsumerUsers
    from kinesis_source.checkpoints.store import CheckpointStore
    from kinesis_source.driver import consumers
    from kinesis_source.tools.cli import main

    stream = make_stream(1)
    with EfoServer(kinesis_backend, activation_delay_s=0.1) as server:
        client = server_client(server.url)
        ddb = boto3.client("dynamodb", endpoint_url=server.url, region_name="us-east-1")
        table = "cli-users-" + stream
        CheckpointStore(ddb, table, "any").ensure_table(create=True)
        consumers.ensure_consumer(client, stream, "in-use", timeout_s=30, poll_s=0.1)
        users = ConsumerUsers(ddb, table, consumers.stream_arn(client, stream), "in-use")
        users.join("running-app", 3, "host-9")
        args = ["consumers", "deregister", "--stream", stream, "--name", "in-use", "--table", table,
                "--endpoint-url", server.url, "--region", "us-east-1"]
        assert main(args) == 1
        err = capsys.readouterr().err
        assert "not deregistering EFO consumer in-use" in err and "application 'running-app'" in err
        assert "--force" in err
        assert [c["ConsumerName"] for c in consumers_of(client, stream)] == ["in-use"]
        assert main([*args, "--force"]) == 0
        assert "deregistered EFO consumer in-use" in capsys.readouterr().out
        assert users.users() == []
        wait_for(lambda: not consumers_of(client, stream), timeout=30, what="consumer gone")


def planner_processes() -> set[int]:
    """PIDs of the Python processes that plan a streaming source for this process's Spark (one
    per running query; other Spark applications on the machine have their own)."""
    import os
    from pathlib import Path

    def parent(pid: int) -> int:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
        return int(stat.rpartition(")")[2].split()[1])

    def ours(pid: int) -> bool:
        while pid > 1:
            if pid == os.getpid():
                return True
            pid = parent(pid)
        return False

    pids = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if b"python_streaming_source_runner" in (proc / "cmdline").read_bytes() and ours(int(proc.name)):
                    pids.add(int(proc.name))
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
    return pids


@pytest.mark.backends("moto")
def test_a_fenced_run_leaves_the_consumer_its_successor_reads_through(
    spark, kinesis_backend, kinesis, make_stream, source_options, tmp_path
):
    """Two runs of one application with deregisterConsumer=true: the newer fences the older,
    whose stopping must not deregister the consumer the newer one reads through; the newer one
    deregisters it when it stops, as the last user."""
    from tests.support.spark_query import Collector, start_query, stop_quietly

    stream = make_stream(1)
    producer = Producer(kinesis, stream)
    producer.put(50)
    with EfoServer(kinesis_backend, activation_delay_s=0.2) as server:
        client = server_client(server.url)
        options = {
            **source_options,
            "streamName": stream,
            "endpointUrl": server.url,
            "consumerMode": "efo",
            "deregisterConsumer": "true",
        }
        before = planner_processes()
        sinks = [Collector(), Collector()]
        older = start_query(spark, options, tmp_path / "older", sinks[0], trigger_ms=500)
        newer = None
        try:
            wait_for(lambda: sinks[0].count() >= 50, timeout=120, what="the older run's rows")
            newer = start_query(spark, options, tmp_path / "newer", sinks[1], trigger_ms=500)
            # The newer run resumes from the older one's DynamoDB commits (its first progress
            # comes after its claim); the older one's next batch finds itself fenced.
            wait_for(lambda: newer.lastProgress is not None, timeout=120, what="the newer run's first trigger")
            producer.put(20)
            wait_for(lambda: not older.isActive, timeout=120, what="the older run to be fenced")
            assert "was claimed by another query" in str(older.exception())
            wait_for(lambda: len(planner_processes() - before) == 1, timeout=60,
                     what="the older run's planner process to end")
            producer.put(30)
            later = {p.seq for p in producer.sent[50:]}
            wait_for(lambda: {r.seq for r in sinks[1].rows()} >= later, timeout=120,
                     what="the newer run to read what was put after the older one stopped")
            assert newer.isActive, newer.exception()
            assert [c["ConsumerName"] for c in consumers_of(client, stream)] == [options["applicationName"]]
        finally:
            stop_quietly(older)
            if newer is not None:
                stop_quietly(newer)
        wait_for(lambda: not consumers_of(client, stream), timeout=60,
                 what="the last run to deregister the consumer when it stops")


@pytest.mark.backends("moto")  # the driver's side: the EFO server fronts either backend alike
def test_in_steady_state_an_efo_query_learns_its_tips_from_its_subscriptions_not_get_records(
    spark, kinesis_backend, kinesis, make_stream, source_options, tmp_path
):
    """Issue 17 item 2: once each shard has been read by fan-out, the read's subscription goes
    on as the shard's tip watch, and the query makes no GetRecords at all (counted at the server
    every call of the query goes to), while every record still arrives exactly once, in order."""
    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    with EfoServer(kinesis_backend, activation_delay_s=0.3) as server:
        options = {
            **source_options,
            "streamName": stream,
            "endpointUrl": server.url,
            "consumerMode": "efo",
            "consumerName": "watch-test",
            "deregisterConsumer": "true",
            "efoSubscriptions": "range",
        }

        def rounds(n):
            for _ in range(n):
                producer.put(12)
                wait_for(lambda: sink.count() >= len(producer.sent), timeout=120,
                         what=f"{len(producer.sent)} rows by EFO")

        with running(spark, options, tmp_path / "efo") as (query, sink):
            for _ in range(10):  # until a batch's progress shows both shards watched
                rounds(1)
                if query.lastProgress and source_report(query.lastProgress).get("watchedShards") == 2:
                    break
            assert source_report(query.lastProgress)["watchedShards"] == 2
            before = dict(server.calls)
            rounds(4)
            after = dict(server.calls)
            assert after.get("GetRecords", 0) == before.get("GetRecords", 0), (before, after)
            assert after.get("GetShardIterator", 0) == before.get("GetShardIterator", 0), (before, after)
            assert after.get("SubscribeToShard", 0) > before.get("SubscribeToShard", 0)
        assert_exactly_once_in_order(sink.rows(), producer.sent)
        assert server.refused == {"ResourceInUseException": 0, "LimitExceededException": 0}
        # Stopping the query ends the watches: their next report finds no driver.
        wait_for(lambda: server.live_subscriptions() == 0, timeout=60, what="the watches to end")


@pytest.mark.backends("moto")
def test_with_efo_tip_watch_off_the_driver_probes_with_get_records(
    spark, kinesis_backend, kinesis, make_stream, source_options, tmp_path
):
    """The opt-out, and the test above's counter-check: the same query without watches makes
    GetRecords calls in the same steady state."""
    stream = make_stream(2)
    producer = Producer(kinesis, stream)
    with EfoServer(kinesis_backend, activation_delay_s=0.3) as server:
        options = {**source_options, "streamName": stream, "endpointUrl": server.url, "consumerMode": "efo",
                   "consumerName": "probe-test", "deregisterConsumer": "true", "efoTipWatch": "false",
                   "efoSubscriptions": "range"}
        with running(spark, options, tmp_path / "efo") as (query, sink):
            producer.put(12)
            wait_for(lambda: sink.count() >= 12, timeout=120, what="12 rows by EFO")
            before = server.calls.get("GetRecords", 0)
            producer.put(12)
            wait_for(lambda: sink.count() >= 24, timeout=120, what="24 rows by EFO")
            assert server.calls.get("GetRecords", 0) > before
            assert source_report(query.lastProgress)["watchedShards"] == 0
        assert_exactly_once_in_order(sink.rows(), producer.sent)
