"""The public models, cached per process so a warm request reads them without a query.

The whole enabled set is small and changes rarely; it is reloaded at most
every MODEL_CACHE_TTL seconds (one query), which bounds how long a price or
cap change takes to reach this process. Reservations copy the prices, so a
request is always settled at the prices it was reserved at.
"""

from __future__ import annotations

import time

from billing.models import PublicModel
from speedinfer.db import db_call

MODEL_CACHE_TTL = 5.0

_models: dict[str, PublicModel] = {}
_loaded_at = float("-inf")


def _load() -> dict[str, PublicModel]:
    return {m.model_id: m for m in PublicModel.objects.filter(enabled=True)}


async def public_models() -> dict[str, PublicModel]:
    """Enabled public models by id (treat as read-only: shared by every request)."""
    global _models, _loaded_at
    if time.monotonic() - _loaded_at > MODEL_CACHE_TTL:
        _models = await db_call(_load)()
        _loaded_at = time.monotonic()
    return _models


def forget() -> None:
    """Drop the cache (tests, and after an operator's change in this process)."""
    global _loaded_at
    _loaded_at = float("-inf")
