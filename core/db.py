"""Database calls from the /v1 event loop.

The lean /v1 app runs no Django request cycle, so nothing would call
close_old_connections() for it, and a connection broken once (PostgreSQL
restarted, a connection killed) would fail every later call on its thread.
`db_call` does what Django does at the start of a request, before each call:
close a connection that erred or outlived CONN_MAX_AGE, and with
CONN_HEALTH_CHECKS check it on first use. These calls are off the hot path (a
warm request's key, models and workers come from memory, and its money
statements from core.pgpool), so the check's round trip costs little.
Calls run on the loop's thread pool rather than asgiref's single
"thread-sensitive" thread, so concurrent cold requests do not queue behind
each other; each call is self-contained. A database that cannot be reached raises
core.outages.DatabaseUnavailable (the gateway's 503 service_unavailable).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import connection

from core.outages import DJANGO_DB_ERRORS, DatabaseUnavailable

P = ParamSpec("P")
R = TypeVar("R")


def _guarded(func: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(func)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            connection.close_if_unusable_or_obsolete()
            return func(*args, **kwargs)
        except DJANGO_DB_ERRORS as exc:
            # Django marks the connection as having erred, so the next call's check above drops it
            # and connects afresh: the service comes back by itself when the database does.
            raise DatabaseUnavailable(str(exc).strip() or type(exc).__name__) from exc

    return run


def db_call(func: Callable[P, R]) -> Callable[P, Coroutine[Any, Any, R]]:
    return sync_to_async(_guarded(func), thread_sensitive=False)


# SQLite takes one writer at a time: writers on many threads (and so many connections) only wait for
# its lock inside the busy handler, which sleeps 1, 2, 5 ... up to 100 ms between tries. One writer
# thread per process, holding one connection, turns that into a plain first-come queue (make bench:
# see README, Performance). PostgreSQL writes concurrently, so there writes use the shared pool.
_sqlite_writer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-writer")


def db_write_call(func: Callable[P, R]) -> Callable[P, Coroutine[Any, Any, R]]:
    """db_call for a write: on SQLite, run on the process's one writer thread."""
    run = _guarded(func)

    @functools.wraps(func)
    async def call(*args: P.args, **kwargs: P.kwargs) -> R:
        if connection.vendor != "sqlite":
            return await sync_to_async(run, thread_sensitive=False)(*args, **kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_sqlite_writer, functools.partial(run, *args, **kwargs))

    return call
