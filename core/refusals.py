"""Refused /v1 requests, counted per account, day and error code, so a customer sees them.

A refusal (400, 401, 402, 403, 404, 429 answered before any worker was called) writes no usage
record: CONTRACT says a refused request is never charged, and the usage records are the charged and
the failed-at-a-worker requests. Instead the gateway counts it here, and the dashboard shows the
counts with their codes.

Off the request path and off the database: a refusal adds one dict increment in memory; the counts
are added to the cache (Redis in production, shared by every process) at most every FLUSH_S by one
job on a worker thread. A successful request pays nothing but the check in `note_refusal`'s caller.
Only a request whose key was recognised is counted: an unknown key is no one's to see.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from django.core.cache import cache

from core.outcome import RequestOutcome

log = logging.getLogger("speedinfer.refusals")

FLUSH_S = 0.5
KEEP_DAYS = 35  # the dashboard's longest range is 31 days
_TTL_S = KEEP_DAYS * 86400

# Every code the gateway refuses with before a worker is called (CONTRACT's errors table).
REFUSAL_CODES: dict[str, int] = {
    "invalid_request": 400,
    "streaming_unsupported": 400,
    "invalid_api_key": 401,
    "insufficient_credits": 402,
    "key_budget_exceeded": 402,
    "insufficient_scope": 403,
    "model_not_allowed": 403,
    "model_not_found": 404,
    "idempotency_key_in_progress": 409,
    "idempotency_key_reused": 422,
    "rate_limit_exceeded": 429,
}

_lock = threading.Lock()
_pending: dict[tuple[int, str, str], int] = {}  # (account, day, code) -> count not yet in the cache
_last: dict[tuple[int, str], str] = {}  # (account, code) -> ISO time of the latest refusal
_flush_scheduled = False
_scheduled_at = 0.0
_tasks: set[asyncio.Future[None]] = set()


def is_refusal(outcome: RequestOutcome) -> bool:
    """A refusal of a known key's request that no worker saw (a worker's own 400 has a usage record)."""
    return (
        outcome.account_id is not None
        and not outcome.worker_id
        and REFUSAL_CODES.get(outcome.error_code) == outcome.status
    )


def note_refusal(outcome: RequestOutcome) -> None:
    """Count the refusal; called on the event loop after the answer went out."""
    global _flush_scheduled, _scheduled_at
    assert outcome.account_id is not None
    now = datetime.now(UTC)
    with _lock:
        key = (outcome.account_id, now.date().isoformat(), outcome.error_code)
        _pending[key] = _pending.get(key, 0) + 1
        _last[(outcome.account_id, outcome.error_code)] = now.isoformat(timespec="seconds")
        # A flush due long ago never ran (its event loop ended first): schedule another.
        if _flush_scheduled and time.monotonic() - _scheduled_at < 10 * FLUSH_S:
            return
        _flush_scheduled, _scheduled_at = True, time.monotonic()
    loop = asyncio.get_running_loop()
    loop.call_later(FLUSH_S, _start_flush, loop)


def _start_flush(loop: asyncio.AbstractEventLoop) -> None:
    task = loop.run_in_executor(None, flush)
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


def flush() -> None:
    """Add the pending counts to the cache (a worker thread; tests call it directly)."""
    global _flush_scheduled
    with _lock:
        pending, last = dict(_pending), dict(_last)
        _pending.clear()
        _last.clear()
        _flush_scheduled = False
    try:
        for (account_id, day, code), count in pending.items():
            counter = _count_key(account_id, day, code)
            # add() is SET NX: of two processes creating the day's counter, one creates, one adds.
            if not cache.add(counter, count, _TTL_S):
                cache.incr(counter, count)
        if last:
            cache.set_many({_last_key(a, code): at for (a, code), at in last.items()}, _TTL_S)
    except Exception as exc:  # a cache outage loses counts, never a request
        log.warning("refused requests not counted (%d kinds): %s", len(pending), exc)


def reset() -> None:
    global _flush_scheduled
    with _lock:
        _pending.clear()
        _last.clear()
        _flush_scheduled = False


def _count_key(account_id: int, day: str, code: str) -> str:
    return f"refusals:{account_id}:{day}:{code}"


def _last_key(account_id: int, code: str) -> str:
    return f"refusals:{account_id}:last:{code}"


@dataclass(frozen=True)
class RefusalCount:
    status: int
    code: str
    count: int
    last_at: datetime | None


def refusal_counts(*, account_id: int, start: date, end: date) -> list[RefusalCount]:
    """The account's refused requests in start..end (UTC days, inclusive) per code, most first."""
    days = [(start + timedelta(days=i)).isoformat() for i in range((end - start).days + 1)][-KEEP_DAYS:]
    keys = {_count_key(account_id, day, code): code for day in days for code in REFUSAL_CODES}
    try:
        counts = cache.get_many(list(keys))
        lasts = cache.get_many([_last_key(account_id, code) for code in REFUSAL_CODES])
    except Exception as exc:
        log.warning("refused requests not readable: %s", exc)
        return []
    totals: dict[str, int] = {}
    for key, value in counts.items():
        totals[keys[key]] = totals.get(keys[key], 0) + int(value)
    rows = [
        RefusalCount(
            status=REFUSAL_CODES[code],
            code=code,
            count=count,
            last_at=_parse(lasts.get(_last_key(account_id, code))),
        )
        for code, count in totals.items()
        if count
    ]
    return sorted(rows, key=lambda r: (-r.count, r.code))


def _parse(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None
