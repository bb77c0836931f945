"""One long-lived, pooled upstream HTTP client per process and event loop.

Per-worker timeouts are passed per request (connect, read, total). Which client
library sits here is a measured choice (see the performance notes in README).
"""

from __future__ import annotations

import asyncio
import weakref

import httpx
from django.conf import settings

# Keyed by the loop itself (weakly): an id() can be reused by a later loop, and a client
# bound to a closed loop must never be handed out.
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = weakref.WeakKeyDictionary()


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
        client = httpx.AsyncClient(
            timeout=default_timeout(),
            limits=httpx.Limits(max_connections=1000, max_keepalive_connections=200, keepalive_expiry=30),
            follow_redirects=False,
        )
        _clients[loop] = client
    return client


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
