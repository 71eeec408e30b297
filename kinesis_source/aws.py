"""One way to build AWS clients, for every service and process.

Kinesis (and, later, DynamoDB and STS) clients are all made here from the same
:class:`AwsSettings`, so a credentials option applies to every service alike. Settings travel
pickled inside partitions to the executors, which build their own clients from them; secrets are
kept out of ``repr``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import boto3
from botocore.config import Config

from .options import OptionError, SourceOptions

# Connect and read timeouts: a dead endpoint should surface as a retried timeout, not a hang.
_CONNECT_TIMEOUT_S = 10
_READ_TIMEOUT_S = 30
# Async probes fan out over all shards at once; aiohttp's default pool of 10 would queue them.
_ASYNC_POOL = 64


@dataclass(frozen=True)
class AwsSettings:
    """Endpoint, region, credentials and retry settings for one service."""

    region: str | None = None
    endpoint_url: str | None = None
    access_key_id: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    profile: str | None = None
    max_attempts: int = 10

    @staticmethod
    def for_kinesis(opts: SourceOptions) -> "AwsSettings":
        """Settings for the Kinesis client of a query."""
        return AwsSettings(
            region=opts.region,
            endpoint_url=opts.endpoint_url,
            access_key_id=opts.aws_access_key_id,
            secret_key=opts.aws_secret_key,
            session_token=opts.aws_session_token,
            profile=opts.profile,
            max_attempts=opts.max_retries,
        )

    @staticmethod
    def for_dynamodb(opts: SourceOptions) -> "AwsSettings":
        """Settings for the checkpoint table's client: same credentials as Kinesis."""
        return AwsSettings(
            region=opts.dynamodb_region or opts.region,
            endpoint_url=opts.dynamodb_endpoint_url,
            access_key_id=opts.aws_access_key_id,
            secret_key=opts.aws_secret_key,
            session_token=opts.aws_session_token,
            profile=opts.profile,
            max_attempts=opts.max_retries,
        )

    def _config(self, **extra: Any) -> Config:
        return Config(
            retries={"mode": "standard", "max_attempts": self.max_attempts},
            connect_timeout=_CONNECT_TIMEOUT_S,
            read_timeout=_READ_TIMEOUT_S,
            **extra,
        )

    def _client_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if self.region:
            kwargs["region_name"] = self.region
        if self.endpoint_url:
            kwargs["endpoint_url"] = self.endpoint_url
        if self.access_key_id:
            kwargs["aws_access_key_id"] = self.access_key_id
            kwargs["aws_secret_access_key"] = self.secret_key
            if self.session_token:
                kwargs["aws_session_token"] = self.session_token
        return kwargs

    def boto3_client(self, service: str) -> Any:
        """A new synchronous client (thread-safe; share it within a process)."""
        session = boto3.session.Session(profile_name=self.profile) if self.profile else (
            boto3.session.Session()
        )
        try:
            return session.client(service, config=self._config(), **self._client_kwargs())
        except Exception as exc:  # noqa: BLE001 - reworded below, original chained
            raise _config_error(service, exc) from exc

    async def aio_client(self, service: str) -> Any:
        """A new entered aiobotocore client; the caller closes it with ``__aexit__``."""
        from aiobotocore.config import AioConfig
        from aiobotocore.session import AioSession

        session = AioSession(profile=self.profile) if self.profile else AioSession()
        base = self._config()
        config = AioConfig(
            retries=base.retries,
            connect_timeout=base.connect_timeout,
            read_timeout=base.read_timeout,
            max_pool_connections=_ASYNC_POOL,
        )
        try:
            creator = session.create_client(service, config=config, **self._client_kwargs())
            return await creator.__aenter__()
        except Exception as exc:  # noqa: BLE001 - reworded below, original chained
            raise _config_error(service, exc) from exc


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
