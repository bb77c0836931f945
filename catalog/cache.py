"""The public models, cached per process so a warm request reads them without a query.

The whole enabled set is small and changes rarely; it is reloaded at most
every MODEL_CACHE_TTL seconds (one query), which bounds how long a price or
cap change takes to reach this process. Reservations copy the prices, so a
request is always settled at the prices it was reserved at.
"""

from __future__ import annotations

import asyncio
import time

from catalog.models import PublicModel
from core.db import db_call

MODEL_CACHE_TTL = 5.0
SERVE_STALE_FOR = 60.0

_models: dict[str, PublicModel] = {}
_loaded_at = float("-inf")
_reloading: asyncio.Task[dict[str, PublicModel]] | None = None


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
    global _reloading
    age = time.monotonic() - _loaded_at
    if age <= MODEL_CACHE_TTL:
        return _models
    loop = asyncio.get_running_loop()
    if _reloading is None or _reloading.done() or _reloading.get_loop() is not loop:
        _reloading = loop.create_task(_reload())
    if age <= SERVE_STALE_FOR:
        return _models
    return await asyncio.shield(_reloading)


def forget() -> None:
    """Drop the cache (tests, and after an operator's change in this process)."""
    global _loaded_at
    _loaded_at = float("-inf")
