"""Pushes committed usage records to the account's live dashboard feed.

`usage_push` is a billing usage listener: it runs on the gateway's hot path,
after the settle transaction commits. It never waits for the channel layer: it
hands the send to an event loop (the server's own loop when called from a
sync_to_async thread, else one private background loop) and returns. Errors are
logged and swallowed, because a lost live update must never fail a request.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Coroutine
from typing import Any

from asgiref.sync import SyncToAsync
from channels.layers import get_channel_layer

from billing.models import UsageRecord
from billing.pricing import format_credits

logger = logging.getLogger(__name__)

_tasks: set[asyncio.Task[None]] = set()  # strong refs until done (the loop keeps only weak ones)
_background: asyncio.AbstractEventLoop | None = None
_background_lock = threading.Lock()


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
        "cost": format_credits(record.cost),
        "latency_ms": record.latency_ms,
    }


async def _send(group: str, message: dict[str, Any]) -> None:
    try:
        layer = get_channel_layer()
        if layer is not None:
            await layer.group_send(group, message)
    except Exception:
        logger.exception("live usage push to %s failed", group)


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


def usage_push(record: UsageRecord) -> None:
    try:
        group = usage_group(record.account_id)
        message = {"type": "usage.record", "usage": usage_event(record)}
        loop = _target_loop()
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
