"""The gateway's database writes, each shaped to be one thread hop from the event loop."""

from __future__ import annotations

from accounts.key_cache import KeyInfo
from accounts.services import api_key_touch
from billing.models import PublicModel, Reservation
from billing.services import credits_reserve


def request_reserve(*, key: KeyInfo, model: PublicModel, amount: int, request_id: str, touch: bool) -> Reservation:
    """Hold credits for one request (raises InsufficientCredits), recording the key's use when due.

    The last-used write rides on the reservation's hop because the request
    crosses to a database thread here anyway; it is due at most once a minute.
    """
    if touch:
        api_key_touch(key_id=key.id)
    return credits_reserve(
        account_id=key.account_id, amount=amount, model=model, api_key_id=key.id, request_id=request_id
    )
