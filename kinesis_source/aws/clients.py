"""One way to build AWS clients, for every service and process.

Kinesis (and, later, DynamoDB and STS) clients are all made here from the same
:class:`AwsSettings`, so a credentials option applies to every service alike. Settings travel
pickled inside partitions to the executors, which build their own clients from them; secrets are
kept out of ``repr``.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field, replace
from typing import Any

from botocore.config import Config
from botocore.exceptions import ClientError

from kinesis_source.aws.options import ConnectionOptions
from kinesis_source.aws.parsing import KINESIS_PARSER_DEFAULTS, KinesisParserFactory
from kinesis_source.aws.retries import RetryRule
from kinesis_source.aws.streams import address_by_arn
from kinesis_source.errors import OptionError
from kinesis_source.options import SourceOptions

# Connect and read timeouts: a dead endpoint should surface as a retried timeout, not a hang.
_CONNECT_TIMEOUT_S = 10
_READ_TIMEOUT_S = 30
# Async probes fan out over all shards at once; aiohttp's default pool of 10 would queue them.
_ASYNC_POOL = 64
# An executor's readers run on up to 16 threads, and with fan-out each tip watch holds its
# subscription's connection (at most 256 per process, executor/watch.py): a smaller pool would
# discard (and log) connections given back while the watches hold theirs.
_SYNC_POOL = 16 + 256


def error_code(exc: BaseException) -> str | None:
    """The AWS error code of a botocore ``ClientError``, else None: the one place that reads it,
    for every service."""
    if isinstance(exc, ClientError):
        return exc.response.get("Error", {}).get("Code")
    return None


def _tune(session: Any, service: str, aio: bool = False) -> Any:
    if service == "kinesis":
        if aio:  # (aiobotocore's factory makes its own parsers: only its defaults are set)
            session.get_component("response_parser_factory").set_parser_defaults(**KINESIS_PARSER_DEFAULTS)
        else:
            session.register_component("response_parser_factory", KinesisParserFactory())
    return session


@dataclass(frozen=True)
class AwsSettings:
    """Endpoint, region, credentials and retry settings for one service."""

    region: str | None = None
    endpoint_url: str | None = None
    access_key_id: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    profile: str | None = None
    role_arn: str | None = None
    role_session_name: str = "kinesis-ddb"
    role_external_id: str | None = field(default=None, repr=False)
    sts_endpoint_url: str | None = None
    credentials_provider: str | None = None  # package.module:function (aws/credentials.py)
    max_retries: int = 10
    retry_base_delay_ms: int = 1000
    # The driver's and the CLI's clients: "could not connect" before any answer is an error in
    # the endpoint options, not an outage (see retries.py).
    fail_fast_unreached: bool = False
    # The source's readers' clients: GetRecords throttles come back to the reader at once.
    paced_reads: bool = False
    # (name, ARN) of the streams given by ARN: Kinesis clients name them by ARN (streams.py)
    stream_arns: tuple[tuple[str, str], ...] = ()
    # Longest silence of an answer being read; an EFO subscription's is subscribeTimeoutMs.
    read_timeout_s: float = _READ_TIMEOUT_S

    @staticmethod
    def for_kinesis(opts: ConnectionOptions) -> AwsSettings:
        """Settings for the Kinesis client of a query."""
        return AwsSettings(
            region=opts.region, endpoint_url=opts.endpoint_url, stream_arns=tuple(opts.stream_arn_map.items()),
            **_credentials(opts),
        )

    @staticmethod
    def for_dynamodb(opts: SourceOptions) -> AwsSettings:
        """Settings for the checkpoint table's client: the same credentials as Kinesis."""
        return AwsSettings(
            region=opts.dynamodb_region or opts.region,
            endpoint_url=opts.dynamodb_endpoint_url,
            **_credentials(opts),
        )

    def retry_rule(self) -> RetryRule:
        """How this client's calls are retried (``maxRetries``, ``retryBaseDelayMs``)."""
        paced = frozenset({"GetRecords"}) if self.paced_reads else frozenset()
        return RetryRule(self.max_retries, self.retry_base_delay_ms, self.fail_fast_unreached, paced)

    def failing_fast(self) -> AwsSettings:
        """These settings for a client that gives up at once on an endpoint it never reached."""
        return replace(self, fail_fast_unreached=True)

    def pacing_reads(self) -> AwsSettings:
        """These settings for a reader's client: it retries ``GetRecords`` throttles itself, when
        its model of the shard's byte budget says (``read_rate.py``)."""
        return replace(self, paced_reads=True)

    def silent_for_at_most(self, seconds: float) -> AwsSettings:
        """These settings for a client whose answers (an EFO subscription's event stream) are
        given up after ``seconds`` without a byte."""
        return replace(self, read_timeout_s=seconds)

    def _install(self, client: Any, service: str) -> None:
        """What every client of these settings gets: our retry rule, the User-Agent built once,
        and (Kinesis) the streams given by ARN addressed by ARN."""
        self.retry_rule().install(client)
        _fix_user_agent(client)
        if service == "kinesis":
            address_by_arn(client, dict(self.stream_arns))

    def _config(self) -> Config:
        # Every request is built by this package from validated options, so botocore's
        # client-side parameter validation only costs time (70% of a 1,000-position commit's
        # client time, docs/benchmarks.md); the service still validates.
        return Config(
            retries={"mode": "standard", "total_max_attempts": self.max_retries + 1},
            connect_timeout=_CONNECT_TIMEOUT_S,
            read_timeout=self.read_timeout_s,
            parameter_validation=False,
            # A task reads its shards on up to this many threads, over one shared client.
            max_pool_connections=_SYNC_POOL,
        )

    def _client_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if self.region:
            kwargs["region_name"] = self.region
        if self.endpoint_url:
            kwargs["endpoint_url"] = self.endpoint_url
        return kwargs

    def _sts_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"region_name": self.region or "us-east-1"}
        if self.sts_endpoint_url:
            kwargs["endpoint_url"] = self.sts_endpoint_url
        return kwargs

    def _assume_role_args(self) -> dict[str, Any]:
        args = {"RoleSessionName": self.role_session_name}
        if self.role_external_id:
            args["ExternalId"] = self.role_external_id
        return args

    def _base_session(self, session: Any, aio: bool = False) -> Any:
        if self.access_key_id:
            session.set_credentials(self.access_key_id, self.secret_key, self.session_token)
        elif self.credentials_provider:
            from kinesis_source.aws import credentials

            made = credentials.aio_credentials if aio else credentials.sync_credentials
            # botocore has no public setter for refreshable credentials on a session.
            session._credentials = made(self.credentials_provider)
        return session

    def boto3_client(self, service: str) -> Any:
        """A new synchronous client (thread-safe; share it within a process)."""
        import botocore.session
        from botocore.credentials import (
            AssumeRoleCredentialFetcher,
            DeferredRefreshableCredentials,
        )

        try:
            source = self._base_session(botocore.session.Session(profile=self.profile))
            session = source
            if self.role_arn:
                # STS runs on the source session, whose response parsing stays botocore's own.
                fetcher = AssumeRoleCredentialFetcher(
                    client_creator=functools.partial(source.create_client, **self._sts_kwargs()),
                    source_credentials=source.get_credentials(),
                    role_arn=self.role_arn,
                    extra_args=self._assume_role_args(),
                )
                session = botocore.session.Session(profile=self.profile)
                # botocore has no public setter for refreshable credentials on a session.
                session._credentials = DeferredRefreshableCredentials(
                    refresh_using=fetcher.fetch_credentials, method="assume-role"
                )
            _tune(session, service)
            client = session.create_client(service, config=self._config(), **self._client_kwargs())
            self._install(client, service)
            return client
        except Exception as exc:  # noqa: BLE001 - reworded below, original chained
            raise _config_error(service, exc) from exc

    async def aio_client(self, service: str, pool: int = _ASYNC_POOL) -> Any:
        """A new entered aiobotocore client (at most ``pool`` connections open); the caller
        closes it with ``__aexit__``."""
        from aiobotocore.config import AioConfig
        from aiobotocore.credentials import (
            AioAssumeRoleCredentialFetcher,
            AioDeferredRefreshableCredentials,
        )
        from aiobotocore.session import AioSession

        base = self._config()
        config = AioConfig(
            retries=base.retries,
            connect_timeout=base.connect_timeout,
            read_timeout=base.read_timeout,
            parameter_validation=base.parameter_validation,
            max_pool_connections=pool,
        )
        try:
            source = self._base_session(AioSession(profile=self.profile), aio=True)
            session = source
            if self.role_arn:
                fetcher = AioAssumeRoleCredentialFetcher(
                    client_creator=functools.partial(source.create_client, **self._sts_kwargs()),
                    source_credentials=await source.get_credentials(),
                    role_arn=self.role_arn,
                    extra_args=self._assume_role_args(),
                )
                session = AioSession(profile=self.profile)
                session._credentials = AioDeferredRefreshableCredentials(
                    refresh_using=fetcher.fetch_credentials, method="assume-role"
                )
            _tune(session, service, aio=True)
            creator = session.create_client(service, config=config, **self._client_kwargs())
            client = await creator.__aenter__()
            self._install(client, service)
            return client
        except Exception as exc:  # noqa: BLE001 - reworded below, original chained
            raise _config_error(service, exc) from exc


def _credentials(opts: ConnectionOptions) -> dict[str, Any]:
    return {
        "access_key_id": opts.aws_access_key_id,
        "secret_key": opts.aws_secret_key,
        "session_token": opts.aws_session_token,
        "profile": opts.profile,
        "role_arn": opts.role_arn,
        "role_session_name": opts.role_session_name,
        "role_external_id": opts.role_external_id,
        "sts_endpoint_url": opts.sts_endpoint_url,
        "credentials_provider": opts.credentials_provider,
        "max_retries": opts.max_retries,
        "retry_base_delay_ms": opts.retry_base_delay_ms,
    }


def _fix_user_agent(client: Any) -> None:
    """Build the client's ``User-Agent`` once instead of twice per request.

    botocore rebuilds and re-sanitizes the whole string for every call, a quarter of the
    planner's CPU per probe call (docs/benchmarks.md). Only its feature-usage suffix can change
    between calls, which is telemetry for AWS, not behaviour. If a botocore release moves the
    builder, requests keep botocore's own header.
    """
    creator = getattr(client, "_user_agent_creator", None)
    build = getattr(creator, "to_string", None)
    if not callable(build):
        return
    value = build()
    creator.to_string = lambda: value  # type: ignore[union-attr]


def _config_error(service: str, exc: Exception) -> Exception:
    from botocore.exceptions import NoRegionError, ProfileNotFound

    if isinstance(exc, NoRegionError):
        return OptionError(
            f"No AWS region for the {service} client: set option 'region' (or AWS_REGION)"
        )
    if isinstance(exc, ProfileNotFound):
        return OptionError(f"Option 'profile': {exc}")
    return exc


_cache_lock = threading.Lock()
_client_cache: dict[tuple[AwsSettings, str], Any] = {}


def shared_client(settings: AwsSettings, service: str) -> Any:
    """A process-wide synchronous client per settings, so reused Python workers keep their
    connection pools across tasks."""
    key = (settings, service)
    with _cache_lock:
        client = _client_cache.get(key)
        if client is None:
            client = settings.boto3_client(service)
            _client_cache[key] = client
        return client
