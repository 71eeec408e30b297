"""Credentials from the user's own code (option ``credentialsProvider``).

The option names ``package.module:function``. The function is called with no arguments, in
every process that calls AWS (the driver's helper, executors, the CLI): it must be importable in
each. It returns a mapping with ``access_key``, ``secret_key``, an optional ``token`` and an
optional ``expiry_time`` (ISO-8601, or a timezone-aware ``datetime``). botocore's refreshable
credentials call it first when a request needs them and again before ``expiry_time``, so
short-lived credentials (a custom identity broker, a vault) keep a long query running. Without
``expiry_time`` the credentials are taken as lasting; the function is not called again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from kinesis_source.errors import OptionError
from kinesis_source.option_values import import_function

OPTION = "credentialsProvider"
METHOD = "kinesis-ddb-credentials-provider"
# What "lasting" means to botocore's refresh logic, which needs an expiry.
_LASTING = timedelta(days=3650)


def fetcher(path: str) -> Callable[[], dict[str, Any]]:
    """A refresh function for botocore: calls the user's function, checks what it gave."""

    def fetch() -> dict[str, Any]:
        func = import_function(path, OPTION, "this Python process")
        try:
            got = func()
        except Exception as exc:
            raise OptionError(f"Option '{OPTION}' = {path!r} raised {type(exc).__name__}: {exc}") from None
        return _metadata(path, got)

    return fetch


def _metadata(path: str, got: Any) -> dict[str, Any]:
    if not isinstance(got, Mapping) or not got.get("access_key") or not got.get("secret_key"):
        keys = sorted(got) if isinstance(got, Mapping) else type(got).__name__
        raise OptionError(
            f"Option '{OPTION}' = {path!r} must return a mapping with 'access_key' and "
            f"'secret_key' (and optionally 'token', 'expiry_time'); it returned {keys}"
        )
    expiry = got.get("expiry_time") or datetime.now(timezone.utc) + _LASTING
    if isinstance(expiry, datetime):
        expiry = expiry.isoformat()
    return {
        "access_key": got["access_key"],
        "secret_key": got["secret_key"],
        "token": got.get("token"),
        "expiry_time": expiry,
    }


def sync_credentials(path: str) -> Any:
    """botocore credentials that call the provider when needed."""
    from botocore.credentials import DeferredRefreshableCredentials

    return DeferredRefreshableCredentials(refresh_using=fetcher(path), method=METHOD)


def aio_credentials(path: str) -> Any:
    """aiobotocore credentials that call the provider (in a thread) when needed."""
    import asyncio

    from aiobotocore.credentials import AioDeferredRefreshableCredentials

    fetch = fetcher(path)

    async def refresh() -> dict[str, Any]:
        return await asyncio.to_thread(fetch)

    return AioDeferredRefreshableCredentials(refresh_using=refresh, method=METHOD)
