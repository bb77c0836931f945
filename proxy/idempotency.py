"""Idempotency-Key on the completion endpoints (docs/interface.md, HTTP): validate, claim, replay, remember.

The claim is made after authentication (a key is scoped to its API key) and before anything is
reserved; the answer is kept only when the request was charged, so a failed first attempt with
nothing charged is not remembered and its repeat runs afresh.
"""

from __future__ import annotations

import hashlib
import logging
import re

import orjson

from accounts.key_cache import KeyInfo
from billing.idempotency import (
    Claim,
    idempotency_claim_async,
    idempotency_complete_async,
    idempotency_forget_async,
)
from core.outages import DatabaseUnavailable
from proxy.errors import GatewayError
from proxy.exchange import Exchange

_HEADER = b"idempotency-key"
_VALID = re.compile(rb"[\x20-\x7e]{1,255}")  # printable ASCII
_REPLAYED = (b"idempotent-replayed", b"true")

log = logging.getLogger("speedinfer.gateway")


def idempotency_key(ex: Exchange) -> str | None:
    """The request's Idempotency-Key, None without one; 400 invalid_request when malformed."""
    values = [value for name, value in ex.scope["headers"] if name == _HEADER]
    if not values:
        return None
    if len(values) > 1 or not _VALID.fullmatch(values[0]):
        raise GatewayError(
            400, "invalid_request", "the Idempotency-Key header must be 1 to 255 printable ASCII characters"
        )
    return values[0].decode()


async def idempotency_begin(ex: Exchange, *, key: KeyInfo, body: bytes) -> Claim | None:
    """Claim the request's key: None without one; a Claim to run or to replay; else 409 / 422."""
    value = idempotency_key(ex)
    if value is None:
        return None
    claim = await idempotency_claim_async(
        api_key_id=key.id, key=value, body_hash=hashlib.sha256(body).hexdigest(), request_id=ex.request_id
    )
    if claim.verdict == "reused":
        raise GatewayError(
            422, "idempotency_key_reused", "this Idempotency-Key was already used with a different request body"
        )
    if claim.verdict == "in_progress":
        raise GatewayError(
            409, "idempotency_key_in_progress", "a request with this Idempotency-Key is still running; retry later"
        )
    if claim.verdict == "run":
        ex.recording = []
    return claim


async def idempotency_replay(ex: Exchange, claim: Claim) -> None:
    """The first answer again, marked as a replay: no worker call, no charge."""
    ex.extra_headers.append(_REPLAYED)
    ex.outcome.error_code = "idempotent_replay"
    if claim.streamed:
        await ex.start_stream()
        await ex.end_stream(claim.body)
    else:
        await ex.respond_json(claim.status, orjson.loads(claim.body))


async def idempotency_end(ex: Exchange, claim: Claim, *, charged: bool) -> None:
    """Keep the answer that was charged for; forget an attempt that charged nothing."""
    assert claim.claim_id is not None
    try:
        if charged and ex.recording is not None:
            await idempotency_complete_async(
                claim_id=claim.claim_id,
                status=ex.outcome.status,
                streamed=ex.outcome.streamed,
                body=b"".join(ex.recording),
            )
        else:
            await idempotency_forget_async(claim_id=claim.claim_id)
    except DatabaseUnavailable:
        # The answer is already on its way; the claim stays "running" (a repeat gets 409) until it is
        # abandoned (billing.idempotency), so a retry is never run twice while the database is away.
        log.warning("request %s: the database is unreachable; its Idempotency-Key stays claimed", ex.request_id)
