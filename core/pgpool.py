"""An async psycopg connection pool per event loop, for the gateway's money statements.

Django's ORM reaches the database from a thread (sync_to_async): two thread hops
per request, each with its own wake-ups and GIL hand-offs, were a third of the
gateway's CPU under load. The three statements of the money path
(billing.ledger.postgresql) are plain SQL already, so on PostgreSQL they run here,
on the event loop, over prepared statements. The pool connects to the same
database Django uses (its settings, so tests get the test database).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from django.conf import settings
from django.db import connections
from psycopg import AsyncConnection
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from core import state

# Django-only keys of DATABASES[...]["OPTIONS"]; everything else is a libpq parameter.
_DJANGO_OPTIONS = {
    "pool",
    "server_side_binding",
    "isolation_level",
    "assume_role",
    "prepare_threshold",
    "cursor_factory",
}


async def _close_opened(future: asyncio.Future[AsyncConnectionPool]) -> None:
    if future.done() and not future.cancelled() and future.exception() is None:
        await future.result().close()


# Per loop: the pool's opening (closed on reset once it opened).
_pools: state.LoopLocal[asyncio.Future[AsyncConnectionPool]] = state.LoopLocal("core.pgpool", close=_close_opened)


def conninfo() -> str:
    db = connections["default"].settings_dict
    params: dict[str, Any] = {
        "dbname": db["NAME"],
        "user": db.get("USER") or None,
        "password": db.get("PASSWORD") or None,
        "host": db.get("HOST") or None,
        "port": str(db["PORT"]) if db.get("PORT") else None,
        "application_name": "speedinfer-gateway",
    }
    for key, value in (db.get("OPTIONS") or {}).items():
        if key not in _DJANGO_OPTIONS and isinstance(value, str | int):
            params[key] = value
    return make_conninfo(**{k: v for k, v in params.items() if v is not None})


async def _configure(conn: AsyncConnection[Any]) -> None:
    # Timestamps come back in UTC, as Django's own connections set them.
    await conn.execute("SET TIME ZONE 'UTC'")


async def _open() -> AsyncConnectionPool:
    pool = AsyncConnectionPool(
        conninfo(),
        min_size=1,
        max_size=settings.SPEEDINFER_DB_POOL_SIZE,
        # Prepared from the first use: the statements are few and run on every request.
        kwargs={"autocommit": True, "prepare_threshold": 0},
        configure=_configure,
        # No per-checkout check: it is a round trip on every request. A connection that broke is
        # discarded by the pool when it comes back with an error, and max_lifetime recycles the rest.
        max_lifetime=600,
        # A checkout waits this long at most (the default is 30 s): an unreachable database is a
        # prompt 503, not a hang. The connect itself is bounded by connect_timeout in the options.
        timeout=settings.SPEEDINFER_DB_TIMEOUT,
        open=False,
        name="speedinfer-gateway",
    )
    await pool.open(wait=True, timeout=settings.SPEEDINFER_DB_TIMEOUT)  # closes the pool when it times out
    return pool


async def get_pool() -> AsyncConnectionPool:
    """This event loop's pool, opened on first use (concurrent first callers share one)."""
    future = _pools.get()
    if future is None or (future.done() and (future.exception() is not None or future.result().closed)):
        future = _pools.set(asyncio.get_running_loop().create_task(_open()))
    return await asyncio.shield(future)


class PoolBusy(PoolTimeout):
    """The checkout queued for SPEEDINFER_DB_QUEUE_TIMEOUT while the pool served others: the database is
    up (keep the pool), this process is only past what its pool can carry."""


@asynccontextmanager
async def queued_connection(pool: AsyncConnectionPool) -> AsyncIterator[AsyncConnection[Any]]:
    """A connection of `pool`, as pool.connection(), queueing through a burst.

    A checkout waits in slices of SPEEDINFER_DB_TIMEOUT. A slice that ends with the pool unable to
    connect (a failed connection attempt since the wait began, or no connection at all) is an
    unreachable database: PoolTimeout, as before, so an outage is still a prompt 503. Any
    other slice is a pool merely busy (a burst of arrivals): the wait goes on, up to
    SPEEDINFER_DB_QUEUE_TIMEOUT in all (then PoolBusy, and the pool stays).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.SPEEDINFER_DB_QUEUE_TIMEOUT
    errors_before = pool.get_stats().get("connections_errors", 0)
    while True:
        wait = max(0.001, min(settings.SPEEDINFER_DB_TIMEOUT, deadline - loop.time()))
        try:
            conn = await pool.getconn(timeout=wait)
            break
        except PoolTimeout:
            stats = pool.get_stats()
            cannot_connect = stats.get("connections_errors", 0) > errors_before or stats.get("pool_size", 0) == 0
            if cannot_connect:
                raise
            if loop.time() >= deadline:
                raise PoolBusy(f"no database connection free within {settings.SPEEDINFER_DB_QUEUE_TIMEOUT} s") from None
    try:
        async with conn:
            yield conn
    finally:
        await pool.putconn(conn)


def discard_pool(pool: AsyncConnectionPool) -> None:
    """The database was unreachable through `pool`: the next caller opens a new one.

    The pool's own reconnection backs off exponentially (1, 2, 4 ... s), so after an outage it could
    come back long after the database did; a fresh pool connects at once, and a pool that cannot
    connect fails its opening within SPEEDINFER_DB_TIMEOUT (then the next request tries again).
    """
    future = _pools.get()
    if future is not None and future.done() and future.exception() is None and future.result() is pool:
        _pools.pop()
    task = asyncio.get_running_loop().create_task(pool.close(timeout=settings.SPEEDINFER_DB_TIMEOUT))
    _closing.add(task)
    task.add_done_callback(_closing.discard)


_closing: set[asyncio.Task[None]] = set()  # strong refs until done (the loop keeps only weak ones)


async def close_pool() -> None:
    """Close this loop's pool (tests, shutdown)."""
    future = _pools.pop()
    if future is not None and future.done() and future.exception() is None:
        await future.result().close()
