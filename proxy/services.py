"""The gateway's database writes, shaped for the event loop."""

from __future__ import annotations

import asyncio

from accounts import key_cache
from accounts.key_cache import KeyInfo
from accounts.services import api_key_touch
from billing.models import Reservation
from billing.services import credits_reserve_async
from catalog.models import PublicModel
from core.db import db_write_call

_touch = db_write_call(api_key_touch)
_background: set[asyncio.Task[None]] = set()  # strong refs until done (the loop keeps only weak ones)


async def request_reserve(*, key: KeyInfo, model: PublicModel, amount: int, request_id: str) -> Reservation:
    """Hold credits for one request (raises InsufficientCredits), recording the key's use when due.

    The last-used write is due at most once a minute per key and process, and
    runs beside the request rather than in its path.
    """
    if key_cache.touch_due(key.id):
        task = asyncio.get_running_loop().create_task(_touch(key_id=key.id))
        _background.add(task)
        task.add_done_callback(_background.discard)
    return await credits_reserve_async(
        account_id=key.account_id,
        amount=amount,
        model=model,
        api_key_id=key.id,
        request_id=request_id,
        budget=key.monthly_budget,
    )
