"""The driver's side of enhanced fan-out: one ACTIVE consumer per stream for the query run.

The consumers are registered (when missing) and waited for on the first planning call that
needs them; partitions carry their ARNs, and executors only subscribe (``executor/fanout.py``).

Each run records itself as a user of its consumers in the checkpoint table
(``checkpoints/consumer_users.py``) and removes itself when it stops;
``deregisterConsumer=true`` deregisters a consumer only when no other run is recorded (a newer
run of the same application that fenced this one, or another application with the same
``consumerName``). Spark never calls a Python source's ``stop()``: it ends the driver-side
Python helper with SIGTERM (measured on pyspark 4.3), so leaving runs from a SIGTERM handler,
and at interpreter exit.

The lifecycle calls (register, wait for ACTIVE, deregister) are here too; executors only
subscribe (``executor/fanout.py``).
"""

from __future__ import annotations

import atexit
import logging
import signal
import socket
import threading
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError
from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception,
    retry_if_exception_type,
    retry_if_result,
    stop_after_delay,
    wait_fixed,
)

from kinesis_source.aws.clients import AwsSettings, error_code, shared_client
from kinesis_source.aws.kinesis import IN_USE, LIMIT_EXCEEDED, NOT_FOUND, stream_must_exist
from kinesis_source.checkpoints.consumer_users import ConsumerUsers
from kinesis_source.errors import (
    ConsumerError,
)
from kinesis_source.options import SourceOptions

if TYPE_CHECKING:
    from kinesis_source.driver.application import Application

log = logging.getLogger(__name__)


ACTIVE = "ACTIVE"


DELETING = "DELETING"


def stream_arn(client: Any, stream_name: str) -> str:
    """The ARN of ``stream_name`` (``DescribeStreamSummary``)."""
    with stream_must_exist(stream_name):
        summary = client.describe_stream_summary(StreamName=stream_name)
    return summary["StreamDescriptionSummary"]["StreamARN"]


def _describe(client: Any, arn: str, consumer_name: str) -> dict | None:
    """The consumer's description, or None when it does not exist."""
    try:
        resp = client.describe_stream_consumer(StreamARN=arn, ConsumerName=consumer_name)
    except ClientError as exc:
        if error_code(exc) == NOT_FOUND:
            return None
        raise
    return resp["ConsumerDescription"]


class _StreamNotActive(Exception):
    """The stream refused a registration because it is not ACTIVE (``status``)."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


def _register_once(client: Any, arn: str, stream_name: str, consumer_name: str) -> None:
    try:
        client.register_stream_consumer(StreamARN=arn, ConsumerName=consumer_name)
    except ClientError as exc:
        code = error_code(exc)
        if code == IN_USE:
            if _describe(client, arn, consumer_name) is not None:
                return  # registered meanwhile by another driver: it is the one we want
            # Kinesis registers consumers only on ACTIVE streams (UPDATING during a reshard).
            with stream_must_exist(stream_name):
                summary = client.describe_stream_summary(StreamName=stream_name)
            raise _StreamNotActive(summary["StreamDescriptionSummary"]["StreamStatus"]) from exc
        if code == LIMIT_EXCEEDED:
            raise ConsumerError(
                f"Cannot register EFO consumer '{consumer_name}' on Kinesis stream "
                f"'{stream_name}': {_which_limit(client, arn)} AWS said: {exc}"
            ) from exc
        raise


def _register(
    client: Any, arn: str, stream_name: str, consumer_name: str, timeout_s: float, poll_s: float
) -> None:
    """Register the consumer, waiting (up to ``timeout_s``) while the stream is not ACTIVE."""
    try:
        Retrying(retry=retry_if_exception_type(_StreamNotActive), **_poll(timeout_s, poll_s))(
            _register_once, client, arn, stream_name, consumer_name
        )
    except RetryError as exc:
        status = exc.last_attempt.exception().status  # type: ignore[union-attr]
        raise ConsumerError(
            f"Cannot register EFO consumer '{consumer_name}' on Kinesis stream '{stream_name}': "
            f"the stream stayed {status}, not ACTIVE, for {timeout_s:g} s (Kinesis registers "
            "consumers only on ACTIVE streams; a reshard or UpdateShardCount makes a stream "
            "UPDATING for a while). Start the query again once the stream is ACTIVE, or raise "
            "'consumerTimeoutMs'."
        ) from None


# Kinesis registers at most this many consumers of a stream at once (CREATING).
MAX_CREATING = 5


def _which_limit(client: Any, arn: str) -> str:
    """Which of Kinesis' limits a ``LimitExceededException`` from ``RegisterStreamConsumer``
    met (botocore has already retried it as throttling, so it is not the call rate)."""
    try:
        consumers = client.list_stream_consumers(StreamARN=arn).get("Consumers", [])
    except ClientError:
        consumers = None
    if consumers is not None and sum(c.get("ConsumerStatus") == "CREATING" for c in consumers) >= MAX_CREATING:
        return (f"{MAX_CREATING} consumers of the stream are being registered at once, the most "
                "Kinesis allows: start again once they are ACTIVE.")
    names = ", ".join(sorted(c.get("ConsumerName", "?") for c in consumers or []))
    held = f"the stream has {len(consumers)} consumers ({names}); " if consumers is not None else ""
    return (f"{held}a stream has at most 20 consumers (50 on On-demand Advantage streams): "
            "deregister unused ones (`kinesis-ddb consumers deregister`) or reuse one with "
            "consumerName.")


def _poll(timeout_s: float, poll_s: float) -> dict[str, Any]:
    return {"stop": stop_after_delay(timeout_s), "wait": wait_fixed(poll_s)}


def _wait_gone(
    client: Any, arn: str, consumer_name: str, timeout_s: float, poll_s: float, error: str
) -> None:
    """Wait until the consumer no longer exists (its name is free again), else raise ``error``."""
    try:
        Retrying(retry=retry_if_result(lambda d: d is not None), **_poll(timeout_s, poll_s))(
            _describe, client, arn, consumer_name
        )
    except RetryError:
        raise ConsumerError(error) from None


def wait_active(
    client: Any, consumer_arn: str, timeout_s: float = 120.0, poll_s: float = 1.0
) -> None:
    """Wait until the consumer ``consumer_arn`` is ACTIVE (a new one is CREATING for a few
    seconds, and cannot subscribe until then)."""

    def status() -> str | None:
        try:
            desc = client.describe_stream_consumer(ConsumerARN=consumer_arn)
        except ClientError as exc:
            if error_code(exc) == NOT_FOUND:
                return None
            raise
        return desc["ConsumerDescription"]["ConsumerStatus"]

    try:
        Retrying(retry=retry_if_result(lambda s: s != ACTIVE), **_poll(timeout_s, poll_s))(status)
    except RetryError as exc:
        last = exc.last_attempt.result()
        raise ConsumerError(
            f"EFO consumer {consumer_arn} is {last or 'gone'}, not ACTIVE, after {timeout_s:g} s"
        ) from None


def ensure_consumer(
    client: Any,
    stream_name: str,
    consumer_name: str,
    timeout_s: float = 120.0,
    poll_s: float = 1.0,
    arn: str | None = None,
) -> str:
    """The ARN of the ACTIVE consumer ``consumer_name`` of ``stream_name`` (whose ARN is
    ``arn``, looked up if not given), registering it first when it does not exist; idempotent
    (several drivers may call it at once)."""
    arn = arn or stream_arn(client, stream_name)
    desc = _describe(client, arn, consumer_name)
    if desc is not None and desc["ConsumerStatus"] == DELETING:
        # A consumer of that name is being deregistered: it must be gone before the name is free.
        log.info("EFO consumer %s of %s is being deleted; waiting", consumer_name, stream_name)
        _wait_gone(
            client, arn, consumer_name, timeout_s, poll_s,
            f"EFO consumer '{consumer_name}' of Kinesis stream '{stream_name}' is still "
            f"DELETING after {timeout_s:g} s",
        )
        desc = None
    if desc is None:
        log.info("registering EFO consumer %s on stream %s", consumer_name, stream_name)
        _register(client, arn, stream_name, consumer_name, timeout_s, poll_s)
        desc = _describe(client, arn, consumer_name)
        if desc is None:
            raise ConsumerError(
                f"EFO consumer '{consumer_name}' of Kinesis stream '{stream_name}' is not there "
                "after RegisterStreamConsumer (deregistered concurrently, or the stream is not "
                "ACTIVE?)"
            )
    if desc["ConsumerStatus"] != ACTIVE:
        wait_active(client, desc["ConsumerARN"], timeout_s, poll_s)
    return desc["ConsumerARN"]


# How long a deregistration waits out a consumer or stream that refuses it for the moment.
IN_USE_WAIT_S = 30.0


def deregister_consumer(
    client: Any,
    stream_name: str,
    consumer_name: str,
    timeout_s: float | None = None,
    poll_s: float = 1.0,
) -> bool:
    """Deregister ``consumer_name`` of ``stream_name``; False if there was none. With
    ``timeout_s``, wait until it is gone (so the name can be registered again)."""
    arn = stream_arn(client, stream_name)
    # A consumer still CREATING (or a stream UPDATING) may refuse with ResourceInUseException
    # for a few seconds: wait that out, as a query stopped while its consumer is made must not
    # leave it registered (billed).
    refused = retry_if_exception(lambda e: isinstance(e, ClientError) and error_code(e) == IN_USE)

    def deregister() -> None:
        client.deregister_stream_consumer(StreamARN=arn, ConsumerName=consumer_name)

    try:
        Retrying(retry=refused, reraise=True, **_poll(timeout_s or IN_USE_WAIT_S, poll_s))(deregister)
    except ClientError as exc:
        if error_code(exc) == NOT_FOUND:
            return False
        raise
    if timeout_s is not None:
        _wait_gone(
            client, arn, consumer_name, timeout_s, poll_s,
            f"EFO consumer '{consumer_name}' of Kinesis stream '{stream_name}' is still "
            f"there {timeout_s:g} s after it was deregistered",
        )
    return True


class Consumers:
    """The run's EFO consumers, by stream name, and the run's claim on them as a user.

    ``app`` is the run's claimed application (its epoch and its checkpoint table), None for a
    run that keeps no users (tests of the consumer calls alone).
    """

    def __init__(self, opts: SourceOptions, app: Application | None = None) -> None:
        self._opts = opts
        self._app = app
        self.name = opts.consumer_name or opts.application_name
        self._arns: dict[str, str] | None = None
        self._users: dict[str, ConsumerUsers] = {}
        self._joined: list[str] = []  # streams whose consumer this run uses or is registering
        self._exit_handled = False
        self._released = threading.Event()

    def _client(self) -> Any:
        return shared_client(AwsSettings.for_kinesis(self._opts), "kinesis")

    def arns(self) -> dict[str, str]:
        """Each stream's consumer ARN, registering and waiting once per run. The run joins the
        consumer's users first, so that a run stopping meanwhile does not deregister it."""
        if self._arns is None:
            client = self._client()
            timeout = self._opts.consumer_timeout_ms / 1000
            # Before registering: a run stopped while its consumer is still CREATING leaves it.
            self._leave_on_exit()
            arns: dict[str, str] = {}
            for stream in self._opts.stream_names:
                arn = stream_arn(client, stream)
                self._join(stream, arn)
                if stream not in self._joined:
                    self._joined.append(stream)
                arns[stream] = ensure_consumer(client, stream, self.name, timeout, arn=arn)
            self._arns = arns
        return self._arns

    def _join(self, stream: str, arn: str) -> None:
        if self._app is None:
            return
        users = ConsumerUsers(self._app.store.client, self._opts.checkpoint_table, arn, self.name)
        me = self._opts.application_name
        users.join(me, self._app.claim(), socket.gethostname())
        self._users[stream] = users
        others = [u for u in users.users() if u.application != me]
        if others:
            log.warning(
                "EFO consumer '%s' of Kinesis stream '%s' is also used by %s. Kinesis gives a "
                "consumer one subscription per shard, so queries sharing it take each other's "
                "subscriptions (each resumes after its last record: nothing is lost, both slow "
                "down): give each application its own 'consumerName'.",
                self.name, stream, ", ".join(map(str, others)),
            )

    def release(self) -> None:
        """Leave the consumers' users and, with ``deregisterConsumer=true``, deregister each
        consumer no other run uses (once). Failures are logged, not raised: the query is
        stopping, and `kinesis-ddb consumers deregister` can finish the job."""
        if self._released.is_set() or not self._joined:
            return
        self._released.set()
        for stream in self._joined:
            try:
                self._release(stream)
            except Exception as exc:  # noqa: BLE001 - best effort while stopping
                log.warning(
                    "could not release EFO consumer '%s' of Kinesis stream '%s' (%s); run "
                    "`kinesis-ddb consumers deregister` to remove it", self.name, stream, exc
                )

    def _release(self, stream: str) -> None:
        users = self._users.get(stream)
        if users is not None:
            assert self._app is not None and self._app.epoch is not None
            if not users.leave(self._opts.application_name, self._app.epoch):
                log.info(
                    "not deregistering EFO consumer '%s' of Kinesis stream '%s': a newer run of "
                    "application '%s' uses it", self.name, stream, self._opts.application_name,
                )
                return
        if not self._opts.deregister_consumer:
            return
        others = users.users() if users is not None else []
        if others:
            log.warning(
                "not deregistering EFO consumer '%s' of Kinesis stream '%s': %s still uses it "
                "(recorded in table '%s'; run `kinesis-ddb consumers deregister` once it stops)",
                self.name, stream, ", ".join(map(str, others)), self._opts.checkpoint_table,
            )
            return
        deregister_consumer(self._client(), stream, self.name)
        log.info("deregistered EFO consumer %s of stream %s", self.name, stream)

    def _leave_on_exit(self) -> None:
        if self._exit_handled:
            return
        self._exit_handled = True
        atexit.register(self.release)
        try:
            previous = signal.getsignal(signal.SIGTERM)
        except ValueError:  # pragma: no cover - not the main thread
            return

        def on_sigterm(signum: int, frame: Any) -> None:
            if self._released.is_set():
                # Spark may close the helper's socket and send SIGTERM at once: the socket's end
                # already led to stop() and its deregistration, which exiting now would cut off.
                return
            self.release()
            if callable(previous):
                previous(signum, frame)
            raise SystemExit(128 + signum)

        try:
            signal.signal(signal.SIGTERM, on_sigterm)
        except ValueError:  # signal handlers can only be set from the main thread
            log.warning(
                "cannot handle SIGTERM outside the main thread: the run leaves its EFO "
                "consumers' users (and deregisterConsumer=true deregisters) only at a clean "
                "interpreter exit"
            )
