"""One long-lived, pooled upstream HTTP client per process and event loop.

Per-worker timeouts are passed per request (connect, read, total). Which client
library sits here is a measured choice (see the performance notes in README).
"""

from __future__ import annotations

import asyncio

import httpx
from django.conf import settings

_clients: dict[int, httpx.AsyncClient] = {}


def default_timeout() -> httpx.Timeout:
    return httpx.Timeout(
        connect=settings.SPEEDINFER_UPSTREAM_CONNECT_TIMEOUT,
        read=settings.SPEEDINFER_UPSTREAM_READ_TIMEOUT,
        write=settings.SPEEDINFER_UPSTREAM_CONNECT_TIMEOUT,
        pool=settings.SPEEDINFER_UPSTREAM_CONNECT_TIMEOUT,
    )


def get_client() -> httpx.AsyncClient:
    """The process's client for the running event loop (clients cannot cross loops)."""
    loop_id = id(asyncio.get_running_loop())
    client = _clients.get(loop_id)
    if client is None or client.is_closed:
        client = httpx.AsyncClient(
            timeout=default_timeout(),
            limits=httpx.Limits(max_connections=1000, max_keepalive_connections=200, keepalive_expiry=30),
            follow_redirects=False,
        )
        _clients[loop_id] = client
    return client
