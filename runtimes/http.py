"""One long-lived, pooled upstream HTTP client per process and event loop.

Per-worker timeouts are passed per request (connect, read, total). Which client
library sits here is a measured choice (see the performance notes in README).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport
from httpx_aiohttp.transport import map_aiohttp_exceptions

from core import state
from runtimes.config import get_runtime_config

# One per loop (core.state.LoopLocal): a client bound to a closed loop must never be handed out.
_clients: state.LoopLocal[httpx.AsyncClient] = state.LoopLocal("runtimes.http.clients", close=lambda c: c.aclose())
# The client's aiohttp transport, when it has one (closed with the client).
_transports: state.LoopLocal[_AiohttpTransport] = state.LoopLocal("runtimes.http.transports")


@dataclass(frozen=True, slots=True)
class Post:
    """One POST to a worker, before any client library's request object is made of it."""

    url: str
    content: bytes
    headers: dict[str, str]
    timeout: httpx.Timeout

    def request(self) -> httpx.Request:
        return get_client().build_request(
            "POST", self.url, content=self.content, headers=self.headers, timeout=self.timeout
        )


async def post_read(post: Post) -> tuple[int, bytes]:
    """Send `post` and read the whole answer: (status, body).

    On aiohttp's pool (the default client) the call goes to aiohttp directly, without httpx's request and
    response objects: building and unwinding those was a tenth of the gateway's CPU per non-streaming
    request (py-spy, c32; docs/performance.md). Failures are raised as httpx's exceptions either way, so
    runtimes.errors.http_failures reads them the same."""
    client = get_client()
    transport = _transports.get()
    if transport is not None:
        return await transport.post_read(post)
    response = await client.send(post.request())
    return response.status_code, response.content


def _translated(exc: httpx.ConnectTimeout, request: httpx.Request | None) -> httpx.TransportError:
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
    def __init__(self, inner: httpx.AsyncByteStream, request: httpx.Request, release: Callable[[], None]) -> None:
        self._inner = inner
        self._request = request
        self._release: Callable[[], None] | None = release

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                yield chunk
        except httpx.ConnectTimeout as exc:
            raise _translated(exc, self._request) from exc.__cause__

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            release, self._release = self._release, None
            if release is not None:
                release()


class _AiohttpTransport(AiohttpTransport):
    """httpx's API over aiohttp's connection pool, with aiohttp's errors told apart correctly.

    aiohttp's own pool limit times out the wait for a free connection and the TCP connect as one
    `connect` timeout, so a process at capacity would look like a worker that does not answer (504,
    counted against its circuit). A request holds one slot of `_slots` from send to the response's close,
    so the wait for a slot is told apart: httpx.PoolTimeout (503 overloaded, runtimes.errors)."""

    def __init__(self, *, limits: httpx.Limits) -> None:
        super().__init__(limits=limits)
        self._slots = asyncio.Semaphore(limits.max_connections or 1_000_000)

    async def _slot(self, pool_wait: float | None, request: httpx.Request | None) -> None:
        slots = self._slots
        if slots.locked():
            try:
                async with asyncio.timeout(pool_wait):
                    await slots.acquire()
            except TimeoutError:
                raise httpx.PoolTimeout("every pooled upstream connection is in use", request=request) from None
        else:
            await slots.acquire()  # a free slot: taken without suspending

    async def post_read(self, post: Post) -> tuple[int, bytes]:
        """`post` on aiohttp's session, the whole answer read (runtimes.http.post_read)."""
        await self._slot(post.timeout.pool, None)
        try:
            if not isinstance(self.client, aiohttp.ClientSession):
                self.client = self.get_client()
            timeout = aiohttp.ClientTimeout(
                sock_connect=post.timeout.connect, sock_read=post.timeout.read, connect=post.timeout.pool
            )
            try:
                with map_aiohttp_exceptions():
                    async with self.client.post(
                        post.url, data=post.content, headers=post.headers, allow_redirects=False, timeout=timeout
                    ) as response:
                        return response.status, await response.read()
            except httpx.ConnectTimeout as exc:
                raise _translated(exc, None) from exc.__cause__
        finally:
            self._slots.release()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        slots = self._slots
        await self._slot(request.extensions.get("timeout", {}).get("pool"), request)
        try:
            response = await super().handle_async_request(request)
        except httpx.ConnectTimeout as exc:
            slots.release()
            raise _translated(exc, request) from exc.__cause__
        except BaseException:
            slots.release()
            raise
        response.stream = _Stream(response.stream, request, slots.release)  # type: ignore[arg-type]
        return response


def default_timeout() -> httpx.Timeout:
    config = get_runtime_config()
    connect = config.connect_timeout
    return httpx.Timeout(connect=connect, read=config.read_timeout, write=connect, pool=connect)


def get_client() -> httpx.AsyncClient:
    """The process's client for the running event loop (clients cannot cross loops)."""
    client = _clients.get()
    if client is None or client.is_closed:
        # httpx's own pool checks every idle connection's socket on each request (encode/httpx#3215):
        # under load that was the gateway's largest CPU cost, so by default httpx runs on aiohttp's pool.
        config = get_runtime_config()
        limits = httpx.Limits(
            max_connections=config.max_connections,
            max_keepalive_connections=config.max_keepalive_connections,
            keepalive_expiry=config.keepalive_expiry,
        )
        transport = _AiohttpTransport(limits=limits) if config.client == "aiohttp" else None
        client = httpx.AsyncClient(
            timeout=default_timeout(), limits=limits, transport=transport, follow_redirects=False
        )
        _clients.set(client)
        if transport is not None:
            _transports.set(transport)
        else:
            _transports.pop()
    return client


async def close_client() -> None:
    """Close this event loop's client (server shutdown, tests)."""
    client = _clients.pop()
    _transports.pop()
    if client is not None:
        await client.aclose()


def worker_timeout(runtime_config: dict[str, object]) -> httpx.Timeout:
    """The per-request timeout for one worker: runtime_config's connect_timeout / read_timeout, else RuntimeConfig's."""

    def seconds(key: str, default: float) -> float:
        value = runtime_config.get(key)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default

    config = get_runtime_config()
    connect = seconds("connect_timeout", config.connect_timeout)
    read = seconds("read_timeout", config.read_timeout)
    return httpx.Timeout(connect=connect, read=read, write=connect, pool=connect)


def worker_total_timeout(runtime_config: dict[str, object]) -> float:
    """The whole call's deadline (httpx has none of its own: read applies per chunk)."""
    value = runtime_config.get("total_timeout")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return get_runtime_config().total_timeout
