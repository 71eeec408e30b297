"""Scenario 10: enhanced fan-out under faults and driver kills (issue 19, item 3).

The campaign of scenario 1 (driver SIGKILLs at seeded points, restarts alternating keep/drop of
the Spark checkpoint, the exactly-once sink) with ``consumerMode=efo`` and
``deregisterConsumer=true``, through the event-stream test server with Kinesis' subscription
rules on (5 s between a shard's subscriptions, 1 call/s), while a fault thread cuts a
subscription mid-range every 6 s the ways Kinesis and networks do: connections dropped,
exception events (``InternalFailureException``), subscriptions taken over (a
``ResourceInUseException`` event, as when another reader subscribes). 0 lost; rows read again
only from the batch in flight; replays under a kept checkpoint identical; the killed runs'
consumer is reused, not registered again. In the first two runs an executor's Python worker is
also SIGKILLed right after its first page, cutting its subscription mid-range: Spark's retry
(another worker) must deliver exactly the planned range.

Also here: the consumer deregistered while the query runs (by hand, another query's
``deregisterConsumer=true``): the query fails, saying so, and its restart registers the
consumer again and loses nothing.
"""

from __future__ import annotations

import threading

import boto3
import pytest

from tests.chaos import harness
from tests.chaos.campaign import run_campaign
from tests.chaos.driver import ChaosDriver
from tests.chaos.harness import BackgroundProducer
from tests.chaos.recipe import sink_records
from tests.chaos.test_kills import assert_campaign, worker_kill_check
from tests.support.checker import check, load_deliveries
from tests.support.efo_server import EfoServer
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.backends(*harness.backends("moto"))]

FAULTS = ("drop", "InternalFailureException", "ResourceInUseException")


class Faults:
    """Every ``interval_s``, a fault (seeded choice) for the next subscription to reach its
    second event. Each costs its reader Kinesis' 5 s before it may subscribe again: a fault
    every 2 s starved the long form's first batch after a restart (it never caught up with the
    producer), so they come every 6 s."""

    def __init__(self, server: EfoServer, rng, interval_s: float = 6.0) -> None:
        self._server, self._rng, self._interval = server, rng, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.armed: dict[str, int] = {}

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            fault = self._rng.choice(FAULTS)
            self.armed[fault] = self.armed.get(fault, 0) + 1
            if fault == "drop":
                self._server.drop_connection(after_events=2)
            else:
                self._server.inject_error(fault, after_events=2)

    def __enter__(self) -> Faults:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.mark.timeout(max(600, 300 + 150 * (harness.KILLS + 1)))
def test_driver_sigkills_with_fan_out_faults_lose_nothing(
    kinesis, kinesis_backend, ddb, make_stream, source_options, tmp_path
):
    stream = make_stream(2)
    with EfoServer(kinesis_backend, activation_delay_s=0.5) as server:
        options = {**source_options, "streamName": stream, "endpointUrl": server.url, "consumerMode": "efo",
                   "deregisterConsumer": "true", "consumerName": "chaos-efo"}
        worker_kills: list[dict] = []

        def check_worker_kill(driver):
            worker_kills.append({"run": driver.run, **worker_kill_check(kinesis, tmp_path, driver, stream)})

        kills = harness.KILLS if harness.LONG else min(harness.KILLS, 2)
        hooks = {i: check_worker_kill for i in range(min(2, kills))}
        for i in hooks:
            (tmp_path / f"killworker-run{i:02d}").write_text("")
        with Faults(server, harness.rng_for("efo-faults")) as faults:
            outcome = run_campaign(
                kinesis=kinesis, ddb=ddb, stream=stream, options=options, out=tmp_path,
                kills=kills, rng=harness.rng_for("sigkill-efo"), hooks=hooks,
            )
        injected = dict(server.injected)
        registered = server.calls.get("RegisterStreamConsumer", 0)
        refused = dict(server.refused)
    harness.publish("fan-out-faults", injected=injected, armed=faults.armed, subscriptions=server.subscriptions,
                    refused=refused, registrations=registered, worker_kills=worker_kills, **outcome.figures())
    assert_campaign(outcome, harness.SEED)
    assert len(worker_kills) == len(hooks)
    assert all(w["delivered_rows"] == w["range_rows"] > 0 for w in worker_kills), worker_kills
    assert sum(injected.values()) >= 3 and len(injected) >= 2, f"too few faults happened: {injected}"
    # SIGKILLed runs cannot deregister; their restarts find the consumer and reuse it
    assert registered == 1, f"the consumer was registered {registered} times"


@pytest.mark.timeout(600)
def test_a_consumer_deregistered_while_running_fails_the_query_clearly_and_its_restart_loses_nothing(
    kinesis, kinesis_backend, ddb, make_stream, source_options, tmp_path
):
    stream = make_stream(2)
    arn = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
    with EfoServer(kinesis_backend, activation_delay_s=0.5) as server:
        options = {**source_options, "streamName": stream, "endpointUrl": server.url, "consumerMode": "efo",
                   "consumerName": "chaos-gone"}
        producer = BackgroundProducer(kinesis, stream, burst=20, interval=0.5).start()
        db = tmp_path / "sink.db"
        first = ChaosDriver("run00", tmp_path, tmp_path / "ck", options, db=db)
        try:
            wait_for(lambda: first.check_alive() and len(sink_records(db)) >= 100, timeout=240,
                     what="the first run to deliver through the consumer")
            admin = boto3.client("kinesis", endpoint_url=server.url, region_name="us-east-1")
            admin.deregister_stream_consumer(StreamARN=arn, ConsumerName="chaos-gone")
            wait_for(lambda: first.failed() is not None, timeout=180, what="the query to fail")
        finally:
            first.kill()
        error = first.error() or ""
        # the subscription's event names the consumer and what to do
        assert "consumer was not found" in error and "chaos-gone" in error and "Restarting" in error, error
        delivered = len(sink_records(db))
        second = ChaosDriver("run01", tmp_path, tmp_path / "ck", options, db=db)
        try:
            wait_for(lambda: second.check_alive() and len(sink_records(db)) >= delivered + 100,
                     timeout=240, what="the restart to deliver")
            sent = producer.stop()
            want = {(p.shard_id, p.seq) for p in sent}
            wait_for(lambda: second.check_alive() and want <= {(r[1], r[2]) for r in sink_records(db)},
                     timeout=240, what="the restart to drain the stream")
        finally:
            producer.stop() if producer.error is None else None
            second.kill()
        registered = server.calls.get("RegisterStreamConsumer", 0)
    deliveries = load_deliveries(tmp_path / "deliveries", ["run00", "run01"])
    totals = check(((p.shard_id, p.seq) for p in sent), deliveries).totals()
    first_rows = [d for d in deliveries if d.run == "run00"]
    again = {k for d in deliveries if d.run == "run01" for k in d.rows} & {k for d in first_rows for k in d.rows}
    harness.publish("fan-out-consumer-deregistered", registrations=registered, records=len(sent),
                    read_again=len(again), **totals)
    assert totals["lost"] == totals["invented"] == totals["out_of_order"] == 0, totals
    # the restart resumes from the Spark checkpoint: only the batch in flight comes again
    assert again <= set(first_rows[-1].rows), f"{len(again)} rows read again beyond the batch in flight"
    assert registered == 2, f"the consumer was registered {registered} times, not again by the restart"
