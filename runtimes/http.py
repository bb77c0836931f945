"""One long-lived, pooled upstream HTTP client per process and event loop.

Per-worker timeouts are passed per request (connect, read, total). Which client
library sits here is a measured choice (see the performance notes in README).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator

import aiohttp
import httpx
from django.conf import settings
from httpx_aiohttp import AiohttpTransport

# Keyed by the loop itself (weakly): an id() can be reused by a later loop, and a client
# bound to a closed loop must never be handed out.
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = weakref.WeakKeyDictionary()


def _translated(exc: httpx.ConnectTimeout, request: httpx.Request) -> httpx.TransportError:
    """httpx-aiohttp 0.2 maps every aiohttp connection error (refused, reset, server gone) to
    ConnectTimeout. Only a real timeout is one (504 upstream_timeout); the rest are connection
    errors (502 upstream_error)."""
    cause = exc.__cause__
    if isinstance(cause, TimeoutError):
        return exc
    if isinstance(cause, aiohttp.ClientConnectorError):
        return httpx.ConnectError(str(exc), request=request)
    return httpx.ReadError(str(exc), request=request)


class _Stream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, request: httpx.Request) -> None:
        self._inner = inner
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                yield chunk
        except httpx.ConnectTimeout as exc:
            raise _translated(exc, self._request) from exc.__cause__

    async def aclose(self) -> None:
        await self._inner.aclose()


class _AiohttpTransport(AiohttpTransport):
    """httpx's API over aiohttp's connection pool, with aiohttp's errors told apart correctly."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = await super().handle_async_request(request)
        except httpx.ConnectTimeout as exc:
            raise _translated(exc, request) from exc.__cause__
        response.stream = _Stream(response.stream, request)  # type: ignore[arg-type]
        return response


def default_timeout() -> httpx.Timeout:
    return httpx.Timeout(
        connect=settings.SPEEDINFER_UPSTREAM_CONNECT_TIMEOUT,
        read=settings.SPEEDINFER_UPSTREAM_READ_TIMEOUT,
        write=settings.SPEEDINFER_UPSTREAM_CONNECT_TIMEOUT,
        pool=settings.SPEEDINFER_UPSTREAM_CONNECT_TIMEOUT,
    )


def get_client() -> httpx.AsyncClient:
    """The process's client for the running event loop (clients cannot cross loops)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None or client.is_closed:
        # httpx's own pool checks every idle connection's socket on each request (encode/httpx#3215):
        # under load that was the gateway's largest CPU cost, so by default httpx runs on aiohttp's pool.
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200, keepalive_expiry=30)
        transport = _AiohttpTransport(limits=limits) if settings.SPEEDINFER_UPSTREAM_CLIENT == "aiohttp" else None
        client = httpx.AsyncClient(
            timeout=default_timeout(), limits=limits, transport=transport, follow_redirects=False
        )
        _clients[loop] = client
    return client


async def close_client() -> None:
    """Close this event loop's client (server shutdown, tests)."""
    client = _clients.pop(asyncio.get_running_loop(), None)
    if client is not None:
        await client.aclose()


def worker_timeout(runtime_config: dict[str, object]) -> httpx.Timeout:
    """The per-request timeout for one worker: runtime_config's connect_timeout / read_timeout, else the settings."""

    def seconds(key: str, default: float) -> float:
        value = runtime_config.get(key)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default

    connect = seconds("connect_timeout", settings.SPEEDINFER_UPSTREAM_CONNECT_TIMEOUT)
    read = seconds("read_timeout", settings.SPEEDINFER_UPSTREAM_READ_TIMEOUT)
    return httpx.Timeout(connect=connect, read=read, write=connect, pool=connect)


def worker_total_timeout(runtime_config: dict[str, object]) -> float:
    """The whole call's deadline (httpx has none of its own: read applies per chunk)."""
    value = runtime_config.get("total_timeout")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return float(settings.SPEEDINFER_UPSTREAM_TOTAL_TIMEOUT)
