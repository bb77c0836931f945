"""Pushes committed usage records to the account's live dashboard feed.

`usage_push` is a billing usage listener: it runs on the gateway's hot path,
after the settle transaction commits. It never waits for the channel layer: it
hands the send to an event loop (the server's own loop when called from a
sync_to_async thread, else one private background loop) and returns. Errors are
logged and swallowed, because a lost live update must never fail a request.

Most accounts have no dashboard open, and a group_send to an empty group still
costs a Redis round trip per request (about a tenth of the gateway's throughput
in `make bench`). So the feed's sockets count themselves in (`watch` /
`unwatch`: a Redis hash shared by every process, or this process's memory
without Redis), and the push is skipped for an account that a snapshot of that
count, at most SNAPSHOT_TTL old, says nobody watches. A stale or missing
snapshot pushes (and refreshes itself in the background), so a dashboard opened
on another process misses nothing for longer than that.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Coroutine
from typing import Any

import redis.exceptions
from asgiref.sync import SyncToAsync
from channels.layers import get_channel_layer
from django.conf import settings

from billing.models import UsageRecord
from core import state
from core.credits import display_credits, format_credits

logger = logging.getLogger(__name__)

_tasks: set[asyncio.Task[None]] = set()  # strong refs until done (the loop keeps only weak ones)
SNAPSHOT_TTL = 1.0
_WATCHERS = "si:live:watchers"
_local_watchers: Counter[int] = Counter()  # without Redis: the one process's sockets
_snapshot: tuple[float, frozenset[int]] | None = None  # (taken at, watched account ids), with Redis
_refreshing = False
_background: asyncio.AbstractEventLoop | None = None
_background_lock = threading.Lock()
_redis_outage = False
_REDIS_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError, TimeoutError)


def _reset() -> None:
    """Forget the watchers and the snapshot (the background loop's thread stays: it holds nothing)."""
    global _snapshot, _refreshing, _redis_outage
    _local_watchers.clear()
    _snapshot, _refreshing, _redis_outage = None, False, False


state.register("console.live", _reset)


def usage_group(account_id: int) -> str:
    return f"usage.{account_id}"


def usage_event(record: UsageRecord) -> dict[str, Any]:
    """What a dashboard shows of one usage record; nothing secret, no key or endpoint."""
    return {
        "request_id": record.request_id,
        "created_at": record.created_at.isoformat(),
        "model": record.model_id,
        "status": record.status,
        "status_display": record.get_status_display(),
        "error_code": record.error_code,
        "prompt_tokens": record.prompt_tokens,
        "completion_tokens": record.completion_tokens,
        "cached_tokens": record.cached_tokens,
        "reasoning_tokens": record.reasoning_tokens,
        "cost": format_credits(record.cost),
        "cost_display": display_credits(record.cost),  # as the page's rows show it (core.credits)
        "latency_ms": record.latency_ms,
    }


def _redis_failed(exc: Exception, what: str) -> None:
    """Redis unreachable: one warning per outage (not a traceback per request); anything else in full."""
    global _redis_outage
    if not isinstance(exc, _REDIS_ERRORS):
        logger.exception("%s failed", what)
    elif not _redis_outage:
        _redis_outage = True
        logger.warning("%s failed: Redis is unreachable (%s); live updates pause until it returns", what, exc)


def _redis_ok() -> None:
    global _redis_outage
    _redis_outage = False


async def _send(group: str, message: dict[str, Any]) -> None:
    try:
        layer = get_channel_layer()
        if layer is not None:
            await layer.group_send(group, message)
            _redis_ok()
    except Exception as exc:
        _redis_failed(exc, f"live usage push to {group}")


def _start(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, None]) -> None:
    task = loop.create_task(coro)
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


def _background_loop() -> asyncio.AbstractEventLoop:
    global _background
    with _background_lock:
        if _background is None or _background.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="live-usage-push", daemon=True).start()
            _background = loop
        return _background


def _target_loop() -> asyncio.AbstractEventLoop:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        pass
    # In a sync_to_async thread, asgiref records the server's loop: sending from
    # there keeps the in-memory channel layer (one per process, bound to that
    # loop) working in the embedded default.
    loop = getattr(SyncToAsync.threadlocal, "main_event_loop", None)
    if loop is not None and loop.is_running():
        return loop
    return _background_loop()


def _redis() -> Any:
    import redis.asyncio as aioredis

    timeout = settings.SPEEDINFER_REDIS_TIMEOUT
    return aioredis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=timeout, socket_timeout=timeout)


async def watch(account_id: int) -> None:
    """A feed socket for this account opened."""
    global _snapshot
    if not settings.REDIS_URL:
        _local_watchers[account_id] += 1
        return
    async with _redis() as client:
        await client.hincrby(_WATCHERS, str(account_id), 1)
    if _snapshot is not None:  # this process pushes to it from now on, whatever its snapshot said
        _snapshot = (_snapshot[0], _snapshot[1] | {account_id})


async def unwatch(account_id: int) -> None:
    """A feed socket for this account closed."""
    if not settings.REDIS_URL:
        _local_watchers[account_id] -= 1
        if _local_watchers[account_id] <= 0:
            del _local_watchers[account_id]
        return
    async with _redis() as client:
        if await client.hincrby(_WATCHERS, str(account_id), -1) <= 0:
            await client.hdel(_WATCHERS, str(account_id))


async def _refresh_snapshot() -> None:
    global _snapshot, _refreshing
    try:
        async with _redis() as client:
            counts = await client.hgetall(_WATCHERS)
        _snapshot = (time.monotonic(), frozenset(int(k) for k, v in counts.items() if int(v) > 0))
        _redis_ok()
    except Exception as exc:
        _redis_failed(exc, "reading the live feed's watchers")
    finally:
        _refreshing = False


def _watched(account_id: int, loop: asyncio.AbstractEventLoop) -> bool:
    global _refreshing
    if not settings.REDIS_URL:
        return account_id in _local_watchers
    snapshot = _snapshot
    if snapshot is not None and time.monotonic() - snapshot[0] < SNAPSHOT_TTL:
        return account_id in snapshot[1]
    if not _refreshing:
        _refreshing = True
        loop.call_soon_threadsafe(_start, loop, _refresh_snapshot())
    return True


def usage_push(record: UsageRecord) -> None:
    try:
        loop = _target_loop()
        if not _watched(record.account_id, loop):
            return
        group = usage_group(record.account_id)
        message = {"type": "usage.record", "usage": usage_event(record)}
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is running:
            _start(loop, _send(group, message))
        else:
            loop.call_soon_threadsafe(_start, loop, _send(group, message))
    except Exception:
        logger.exception("live usage push failed")
