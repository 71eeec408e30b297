"""Scenario 10: enhanced fan-out under faults and driver kills (issue 19, item 3).

The campaign of scenario 1 (driver SIGKILLs at seeded points, restarts alternating keep/drop of
the Spark checkpoint, the exactly-once sink) with ``consumerMode=efo`` and
``deregisterConsumer=true``, through the event-stream test server with Kinesis' subscription
rules on (5 s between a shard's subscriptions, 1 call/s), while a fault thread cuts a
subscription mid-range every 6 s the ways Kinesis and networks do: connections dropped,
exception events (``InternalFailureException``), subscriptions taken over (a
``ResourceInUseException`` event, as when another reader subscribes). 0 lost; rows read again
only from the batch in flight; replays under a kept checkpoint identical; the killed runs'
consumer is reused, not registered again.
"""

from __future__ import annotations

import threading

import pytest

from tests.chaos import harness
from tests.chaos.campaign import run_campaign
from tests.chaos.test_kills import assert_campaign
from tests.support.efo_server import EfoServer

pytestmark = [pytest.mark.spark, pytest.mark.backends("moto")]

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
        with Faults(server, harness.rng_for("efo-faults")) as faults:
            outcome = run_campaign(
                kinesis=kinesis, ddb=ddb, stream=stream, options=options, out=tmp_path,
                kills=harness.KILLS if harness.LONG else min(harness.KILLS, 2),
                rng=harness.rng_for("sigkill-efo"),
            )
        injected = dict(server.injected)
        registered = server.calls.get("RegisterStreamConsumer", 0)
        refused = dict(server.refused)
    harness.publish("fan-out-faults", injected=injected, armed=faults.armed, subscriptions=server.subscriptions,
                    refused=refused, registrations=registered, **outcome.figures())
    assert_campaign(outcome, harness.SEED)
    assert sum(injected.values()) >= 3 and len(injected) >= 2, f"too few faults happened: {injected}"
    # SIGKILLed runs cannot deregister; their restarts find the consumer and reuse it
    assert registered == 1, f"the consumer was registered {registered} times"
