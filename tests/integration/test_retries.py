"""`maxRetries` and `retryBaseDelayMs` change what the clients do, as docs/options.md says:
counted on a throttling proxy in front of moto, and on a port nobody listens on."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from kinesis_source.aws.clients import AwsSettings
from kinesis_source.aws.retries import UNREACHED_RETRIES
from tests.support.proxy import THROTTLED, FaultProxy

pytestmark = pytest.mark.backends("moto")

LOGGER = "kinesis_source.aws.retries"


def refused_port() -> int:
    with socket.socket() as s:  # bound, never listening: connections are refused
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def settings(url: str, **kw) -> AwsSettings:
    return AwsSettings(region="us-east-1", endpoint_url=url, access_key_id="local",
                       secret_key="local", **kw)


def waits(caplog) -> list[float]:
    return [float(r.getMessage().split(" in ")[1].split(" s ")[0])
            for r in caplog.records if r.name == LOGGER]


@pytest.mark.parametrize("max_retries", [0, 3])
def test_max_retries_counts_retries_after_the_first_attempt(endpoint, max_retries, caplog):
    with FaultProxy(endpoint.url) as proxy:
        proxy.throttle({"ListStreams"}, 1.0)
        client = settings(proxy.url, max_retries=max_retries, retry_base_delay_ms=1).boto3_client("kinesis")
        with caplog.at_level(logging.DEBUG, logger=LOGGER), pytest.raises(ClientError) as err:
            client.list_streams()
    assert proxy.injected(THROTTLED) == max_retries + 1
    assert len(waits(caplog)) == max_retries
    if max_retries:
        assert f"reached max retries: {max_retries}" in str(err.value)


def test_retry_base_delay_sets_the_waits_between_throttled_attempts(endpoint, caplog):
    base_s = 0.4
    with FaultProxy(endpoint.url) as proxy:
        proxy.throttle({"ListStreams"}, 1.0)
        client = settings(proxy.url, max_retries=3, retry_base_delay_ms=int(base_s * 1000)).boto3_client("kinesis")
        with caplog.at_level(logging.DEBUG, logger=LOGGER), pytest.raises(ClientError):
            client.list_streams()
        times = [s.at for s in proxy.operations()]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    for n, (gap, wait) in enumerate(zip(gaps, waits(caplog), strict=True), start=1):
        step = base_s * 2 ** (n - 1)
        assert step / 2 <= wait <= step
        assert gap >= wait, (n, gap, wait)


def test_a_small_base_retries_at_once(endpoint, caplog):
    with FaultProxy(endpoint.url) as proxy:
        proxy.throttle({"ListStreams"}, 1.0)
        client = settings(proxy.url, max_retries=3, retry_base_delay_ms=1).boto3_client("kinesis")
        with caplog.at_level(logging.DEBUG, logger=LOGGER), pytest.raises(ClientError):
            client.list_streams()
    assert [w <= 0.001 * 2 ** n for n, w in enumerate(waits(caplog))] == [True] * 3


def test_a_refused_port_is_retried_max_retries_times_by_executor_clients(caplog):
    url = f"http://127.0.0.1:{refused_port()}"
    client = settings(url, max_retries=4, retry_base_delay_ms=20).boto3_client("kinesis")
    with caplog.at_level(logging.DEBUG, logger=LOGGER), pytest.raises(EndpointConnectionError):
        client.list_streams()
    got = waits(caplog)
    assert len(got) == 4
    # connection errors wait a twentieth of the base: 1 ms doubling, at least half of it
    assert all(0.0005 * 2 ** n <= w <= 0.001 * 2 ** n for n, w in enumerate(got))


def test_driver_clients_give_up_at_once_on_an_endpoint_they_never_reached(caplog):
    url = f"http://127.0.0.1:{refused_port()}"
    fast = settings(url, max_retries=10).failing_fast()
    with caplog.at_level(logging.DEBUG, logger=LOGGER), pytest.raises(EndpointConnectionError):
        fast.boto3_client("kinesis").list_streams()
    assert len(waits(caplog)) == UNREACHED_RETRIES

    async def aio() -> None:
        client = await fast.aio_client("kinesis")
        try:
            await client.list_streams()
        finally:
            await client.__aexit__(None, None, None)

    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=LOGGER), pytest.raises(EndpointConnectionError):
        asyncio.run(aio())
    assert len(waits(caplog)) == UNREACHED_RETRIES


def test_a_driver_client_that_reached_its_endpoint_rides_out_an_outage(endpoint, caplog):
    with FaultProxy(endpoint.url) as proxy:
        client = settings(proxy.url, max_retries=5, retry_base_delay_ms=20).failing_fast().boto3_client("kinesis")
        client.list_streams()
        proxy.down = True  # the open connection is dropped...
    # ...and the proxy is gone: its port refuses new connections, as a failed endpoint's would
    with caplog.at_level(logging.DEBUG, logger=LOGGER), pytest.raises(EndpointConnectionError):
        client.list_streams()
    assert len(waits(caplog)) == 5
    assert sum("EndpointConnectionError" in r.getMessage() for r in caplog.records) >= 4


def test_an_unreachable_endpoint_is_not_taken_for_a_missing_stream():
    """With failOnDataLoss=false a missing stream is read as empty; an endpoint that cannot be
    reached must still fail, naming the option."""
    from kinesis_source.driver.planner import Planner
    from kinesis_source.errors import KinesisSourceError
    from kinesis_source.options import SourceOptions

    opts = SourceOptions.parse({"streamName": "orders", "applicationName": "a", "region": "us-east-1",
                                "endpointUrl": f"http://127.0.0.1:{refused_port()}",
                                "failOnDataLoss": "false", "awsAccessKeyId": "k", "awsSecretKey": "s"})
    planner = Planner(opts)
    try:
        with pytest.raises(KinesisSourceError, match="Could not connect to Kinesis for stream 'orders'"):
            planner.shard_ids()
    finally:
        planner.close()
