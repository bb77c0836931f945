"""Settlements the database could not take when the request ended, retried until it can.

A request whose worker answered is settled with the worker's usage; one that failed is released.
When the database is unreachable at that moment (cut between reserve and settle), the close is kept
here, in this process, and retried every RETRY_INTERVAL seconds, so the hold is settled or released
as soon as the database is back instead of waiting for the reservation sweep. A retry is safe: a
settle or release only claims a reservation still held, so one that did commit before its answer
was lost is a no-op the second time. If the process dies first, the sweep releases the hold.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from core.metrics import observe_queued_close
from core.outages import DatabaseUnavailable

log = logging.getLogger("speedinfer.gateway")

RETRY_INTERVAL = 1.0


@dataclass(slots=True)
class _Pending:
    what: str  # "settle" or "release", for the log
    reservation_id: object
    close: Callable[[], Awaitable[object]]


_queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[_Pending]] = weakref.WeakKeyDictionary()
_drains: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = weakref.WeakKeyDictionary()


def pending_count() -> int:
    """Closes waiting for the database in this process (all loops)."""
    return sum(len(queue) for queue in _queues.values())


def pending_close(*, what: str, reservation_id: object, close: Callable[[], Awaitable[object]]) -> None:
    """Keep `close` (a settle or release of `reservation_id`) and retry it until the database takes it."""
    loop = asyncio.get_running_loop()
    queue = _queues.get(loop)
    if queue is None:
        queue = _queues[loop] = []
    queue.append(_Pending(what, reservation_id, close))
    observe_queued_close(1)
    log.warning("reservation %s: the database is unreachable; the %s is queued and retried", reservation_id, what)
    drain = _drains.get(loop)
    if drain is None or drain.done():
        _drains[loop] = loop.create_task(_drain(queue))


async def _drain(queue: list[_Pending]) -> None:
    while queue:
        await asyncio.sleep(RETRY_INTERVAL)
        for item in list(queue):
            try:
                await item.close()
            except DatabaseUnavailable:
                break  # still down: the rest would fail the same way
            except Exception:
                log.exception(
                    "reservation %s: the queued %s failed; the sweep releases it", item.reservation_id, item.what
                )
            else:
                log.info("reservation %s: the queued %s was written", item.reservation_id, item.what)
            queue.remove(item)
            observe_queued_close(-1)
