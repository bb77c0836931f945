"""A small per-process cache of authenticated keys, keyed by their digest.

A warm key costs no query. Entries live SPEEDINFER_KEY_CACHE_TTL seconds (core.cache_policy, with
no stale window), which bounds how long a revocation made in another process takes to apply here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings

from core import state
from core.cache_policy import CachePolicy

_MAX_ENTRIES = 10_000


@dataclass(frozen=True, slots=True)
class KeyInfo:
    id: int
    account_id: int
    account_name: str
    name: str
    prefix: str
    digest: str
    scopes: frozenset[str]
    allowed_models: frozenset[str]
    rpm: int | None
    tpm: int | None
    expires_at: datetime | None
    revoked: bool
    monthly_budget: int | None = None  # micro-credits per calendar month (UTC)
    priority: str = "normal"  # high | normal | low (workers.queue)


_entries: dict[str, tuple[float, KeyInfo]] = {}
_last_touch: dict[int, float] = {}
_policy = state.Lazy("accounts.key_cache.policy", lambda: CachePolicy(ttl=settings.SPEEDINFER_KEY_CACHE_TTL))
cache_policy = _policy.get


def get(digest: str) -> KeyInfo | None:
    entry = _entries.get(digest)
    if entry is None:
        return None
    stored_at, info = entry
    if not _policy.get().fresh(time.monotonic() - stored_at):
        _entries.pop(digest, None)
        return None
    return info


def put(info: KeyInfo) -> None:
    if len(_entries) >= _MAX_ENTRIES:
        _entries.clear()
    _entries[info.digest] = (time.monotonic(), info)


def forget(digest: str) -> None:
    _entries.pop(digest, None)


def clear() -> None:
    _entries.clear()
    _last_touch.clear()


state.register("accounts.key_cache", clear)


def touch_due(key_id: int, *, every_seconds: float = 60.0) -> bool:
    """True at most once a minute per key and process: time to write last_used_at."""
    now = time.monotonic()
    last = _last_touch.get(key_id)
    if last is not None and now - last < every_seconds:
        return False
    if len(_last_touch) >= _MAX_ENTRIES:
        _last_touch.clear()
    _last_touch[key_id] = now
    return True
