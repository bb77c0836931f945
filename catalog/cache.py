"""The public models, cached per process so a warm request reads them without a query.

The whole enabled set is small and changes rarely; it is reloaded at most
every SPEEDINFER_MODEL_CACHE_TTL seconds (one query; core.cache_policy), which bounds
how long a price or cap change takes to reach this process. Reservations copy the
prices, so a request is always settled at the prices it was reserved at.
"""

from __future__ import annotations

import asyncio
import time

from django.conf import settings

from catalog.models import PublicModel
from core import state
from core.cache_policy import CachePolicy
from core.db import db_call

# A stale set is served while it reloads for up to a minute after its load (the TTL included).
_STALE_UNTIL = 60.0

_models: dict[str, PublicModel] = {}
_loaded_at = float("-inf")
_reloading: state.LoopLocal[asyncio.Task[dict[str, PublicModel]]] = state.LoopLocal("catalog.cache.reloading")


def _build_policy() -> CachePolicy:
    ttl = settings.SPEEDINFER_MODEL_CACHE_TTL
    return CachePolicy(ttl=ttl, serve_stale_for=max(0.0, _STALE_UNTIL - ttl))


_policy = state.Lazy("catalog.cache.policy", _build_policy)
cache_policy = _policy.get


def _load() -> dict[str, PublicModel]:
    return {m.model_id: m for m in PublicModel.objects.filter(enabled=True)}


async def _reload() -> dict[str, PublicModel]:
    global _models, _loaded_at
    _models = await db_call(_load)()
    _loaded_at = time.monotonic()
    return _models


async def public_models() -> dict[str, PublicModel]:
    """Enabled public models by id (treat as read-only: shared by every request).

    A stale set (up to a minute old) is served while one reload runs beside the
    request, so no request waits for the query once the process is warm."""
    age = time.monotonic() - _loaded_at
    policy = _policy.get()
    if policy.fresh(age):
        return _models
    reloading = _reloading.get()
    if reloading is None or reloading.done():
        reloading = _reloading.set(asyncio.get_running_loop().create_task(_reload()))
    if policy.servable(age):
        return _models
    return await asyncio.shield(reloading)


def forget() -> None:
    """Drop the cache (tests, and after an operator's change in this process)."""
    global _models, _loaded_at
    _models = {}
    _loaded_at = float("-inf")


state.register("catalog.cache", forget)
