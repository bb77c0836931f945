"""Who is calling: the request's API key, with the scope its endpoint needs."""

from __future__ import annotations

from accounts.key_cache import KeyInfo
from accounts.selectors import api_key_authenticate_async
from proxy.errors import GatewayError
from proxy.exchange import Exchange


async def authenticate(ex: Exchange, scope: str) -> KeyInfo:
    """The request's key with `scope`, or 401 invalid_api_key / 403 insufficient_scope."""
    with ex.trace.step("authenticate"):
        return await _authenticate(ex, scope)


async def _authenticate(ex: Exchange, scope: str) -> KeyInfo:
    result = await api_key_authenticate_async(raw_key=ex.bearer())
    key = result.key
    if key is not None:
        ex.outcome.account_id, ex.outcome.key_prefix = key.account_id, key.prefix
    if key is None:
        reason = {"missing": "no API key was given (Authorization: Bearer ...)"}.get(
            result.reason or "", f"the API key is {result.reason or 'unknown'}"
        )
        raise GatewayError(401, "invalid_api_key", reason)
    if scope not in key.scopes:
        raise GatewayError(403, "insufficient_scope", f"this key lacks the '{scope}' scope")
    return key
