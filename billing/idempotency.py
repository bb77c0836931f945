"""Idempotency-Key writes (docs/interface.md): claim a key, keep the answer that was charged for, forget a failure.

Stored with the ledger, so a replay is decided by the same database that holds the money: the claim
is an INSERT guarded by the unique (api_key, key) constraint, so of two identical requests at once
exactly one inserts and runs; the other finds the row still running (409). Same engine on SQLite
and PostgreSQL (plain ORM, one short transaction each).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from billing.models import IdempotencyKey
from core.db import db_write_call

# How long an answer is replayed; an older key is claimed afresh.
KEEP = timedelta(hours=24)
# A claim still "running" after this long belongs to a process that died (no request runs past
# the upstream total timeout, 10 minutes by default): a repeat may claim it.
_ABANDONED = timedelta(minutes=20)


@dataclass(frozen=True, slots=True)
class Claim:
    verdict: str  # "run" | "replay" | "in_progress" | "reused"
    claim_id: int | None = None  # the row to complete or forget ("run")
    status: int = 0  # "replay": the first answer
    streamed: bool = False
    body: bytes = b""


def idempotency_claim(*, api_key_id: int, key: str, body_hash: str, request_id: str = "") -> Claim:
    """Claim `key` for this request, or say why not (a replay, a request still running, another body)."""
    for _ in range(2):
        try:
            with transaction.atomic():
                row = IdempotencyKey.objects.create(
                    api_key_id=api_key_id, key=key, body_hash=body_hash, request_id=request_id
                )
            return Claim("run", claim_id=row.pk)
        except IntegrityError:
            pass
        found = IdempotencyKey.objects.filter(api_key_id=api_key_id, key=key).first()
        if found is None:  # forgotten between our insert and this read: try the insert again
            continue
        now = timezone.now()
        abandoned = found.state == IdempotencyKey.State.RUNNING and found.created_at < now - _ABANDONED
        if found.created_at < now - KEEP or abandoned:
            # Expired: delete exactly that row (a racing claimer may already have replaced it), then claim.
            IdempotencyKey.objects.filter(pk=found.pk, created_at=found.created_at).delete()
            continue
        if found.body_hash != body_hash:
            return Claim("reused")
        if found.state == IdempotencyKey.State.RUNNING:
            return Claim("in_progress")
        return Claim("replay", status=found.status, streamed=found.streamed, body=bytes(found.body))
    return Claim("in_progress")


def idempotency_complete(*, claim_id: int, status: int, streamed: bool, body: bytes) -> None:
    """Keep the answer that was charged for; later repeats replay it."""
    IdempotencyKey.objects.filter(pk=claim_id, state=IdempotencyKey.State.RUNNING).update(
        state=IdempotencyKey.State.DONE, status=status, streamed=streamed, body=body
    )


def idempotency_forget(*, claim_id: int) -> None:
    """The first attempt failed with nothing charged: not remembered, a repeat runs afresh."""
    IdempotencyKey.objects.filter(pk=claim_id, state=IdempotencyKey.State.RUNNING).delete()


def idempotency_purge(*, older_than: timedelta = KEEP) -> int:
    """Drop keys past their replay window (the sweeper's schedule calls it)."""
    deleted, _ = IdempotencyKey.objects.filter(created_at__lt=timezone.now() - older_than).delete()
    return deleted


idempotency_claim_async = db_write_call(idempotency_claim)
idempotency_complete_async = db_write_call(idempotency_complete)
idempotency_forget_async = db_write_call(idempotency_forget)
