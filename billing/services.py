"""Writes that move money: grant, reserve, settle, release, expire.

On PostgreSQL the gateway's three (reserve, settle, release) are one statement
each (billing.ledger_sql); elsewhere (the embedded SQLite) they are the ORM
transactions below. Both keep the same invariants and are tested alike.

Every operation is one short transaction that changes the account row with a
conditional UPDATE (never read-then-write), claims reservation state changes
with a conditional UPDATE and a row-count check, and appends a ledger row with
the balances after. No network I/O happens inside these transactions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from accounts.models import Account
from billing import ledger_sql
from billing.models import LedgerEntry, PublicModel, Reservation, UsageRecord
from billing.pricing import cost_of, format_credits
from speedinfer.db import db_call

# Called with the UsageRecord after its transaction commits (live dashboard,
# metrics). Registered by the apps that want it, so billing imports none of them.
usage_listeners: list[Callable[[UsageRecord], None]] = []


class InsufficientCredits(Exception):
    pass


class InvalidAmount(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a request ended, for its usage record."""

    worker_id: str = ""
    endpoint: str = ""
    latency_ms: int = 0
    ttft_ms: int | None = None
    streamed: bool = False


def _ledger(
    *,
    account_id: int,
    kind: str,
    amount: int,
    available_delta: int,
    reserved_delta: int,
    reference: str = "",
    actor: str = "",
    note: str = "",
) -> LedgerEntry:
    # Our UPDATE holds the account row's lock until commit, so this read sees
    # exactly the balances our change produced.
    available, reserved = Account.objects.filter(pk=account_id).values_list("available", "reserved").get()
    return LedgerEntry.objects.create(
        account_id=account_id,
        kind=kind,
        amount=amount,
        available_delta=available_delta,
        reserved_delta=reserved_delta,
        available_after=available,
        reserved_after=reserved,
        reference=reference,
        actor=actor,
        note=note,
    )


def _usage_params(outcome: Outcome, *, status: str, error_code: str) -> dict[str, object]:
    return {
        "endpoint": outcome.endpoint,
        "worker_id": outcome.worker_id,
        "latency_ms": outcome.latency_ms,
        "ttft_ms": outcome.ttft_ms,
        "streamed": outcome.streamed,
        "usage_status": status,
        "error_code": error_code,
    }


def _notify_on_commit(record: UsageRecord) -> None:
    def fire() -> None:
        for listener in usage_listeners:
            listener(record)

    transaction.on_commit(fire)


def credits_grant(*, account: Account, amount: int, actor: object, note: str = "", via: str = "") -> LedgerEntry:
    """Add (or, negative, remove) available credits. A removal never takes available below zero.

    `actor` (a staff user, a command's name) is written on the ledger row and, with the amount and
    note, on an audit row in the same transaction."""
    from accounts.services import actor_name, audit_record

    if amount == 0:
        raise InvalidAmount("amount must not be zero")
    with transaction.atomic(durable=True):
        rows = Account.objects.filter(pk=account.pk)
        if amount < 0:
            rows = rows.filter(available__gte=-amount)
        if rows.update(available=F("available") + amount) != 1:
            raise InsufficientCredits(f"account {account.name!r} has less than {-amount} micro-credits available")
        entry = _ledger(
            account_id=account.pk,
            kind=LedgerEntry.Kind.GRANT,
            amount=amount,
            available_delta=amount,
            reserved_delta=0,
            actor=actor_name(actor),
            note=note,
        )
        detail = {"amount": format_credits(amount), "note": note, "ledger_entry": entry.pk}
        audit_record(actor=actor, action="credits.grant", target=account, detail=detail | ({"via": via} if via else {}))
    return entry


def _new_reservation(
    *, account_id: int, amount: int, model: PublicModel, api_key_id: int | None, request_id: str
) -> Reservation:
    if amount <= 0:
        raise InvalidAmount("a reservation must be positive")
    return Reservation(
        id=uuid4(),
        account_id=account_id,
        api_key_id=api_key_id,
        model_id=model.model_id,
        amount=amount,
        input_price=model.input_price,
        output_price=model.output_price,
        request_id=request_id,
        created_at=timezone.now(),
    )


def _reserve_statement(reservation: Reservation) -> ledger_sql.Statement:
    return ledger_sql.reserve(
        reservation_id=reservation.id,
        account_id=reservation.account_id,
        api_key_id=reservation.api_key_id,
        model_id=reservation.model_id,
        amount=reservation.amount,
        input_price=reservation.input_price,
        output_price=reservation.output_price,
        request_id=reservation.request_id,
        now=reservation.created_at,
    )


def _held(reservation: Reservation, held: object) -> Reservation:
    if held is not True:
        raise InsufficientCredits("insufficient credits for this request")
    reservation._state.adding = False
    return reservation


def credits_reserve(
    *,
    account_id: int,
    amount: int,
    model: PublicModel,
    api_key_id: int | None = None,
    request_id: str = "",
) -> Reservation:
    """Hold `amount` micro-credits for one request, or raise InsufficientCredits."""
    reservation = _new_reservation(
        account_id=account_id, amount=amount, model=model, api_key_id=api_key_id, request_id=request_id
    )
    if connection.vendor == "postgresql":
        return _held(reservation, ledger_sql.execute(_reserve_statement(reservation)))
    with transaction.atomic(durable=True):
        held_rows = Account.objects.filter(pk=account_id, available__gte=amount).update(
            available=F("available") - amount, reserved=F("reserved") + amount
        )
        if held_rows != 1:
            raise InsufficientCredits("insufficient credits for this request")
        reservation.save(force_insert=True)
        _ledger(
            account_id=account_id,
            kind=LedgerEntry.Kind.RESERVE,
            amount=amount,
            available_delta=-amount,
            reserved_delta=amount,
            reference=str(reservation.pk),
            actor="gateway",
        )
    return reservation


async def credits_reserve_async(
    *,
    account_id: int,
    amount: int,
    model: PublicModel,
    api_key_id: int | None = None,
    request_id: str = "",
) -> Reservation:
    """credits_reserve for the event loop: on PostgreSQL one pooled statement, no thread hop."""
    if connection.vendor != "postgresql":
        return await db_call(credits_reserve)(
            account_id=account_id, amount=amount, model=model, api_key_id=api_key_id, request_id=request_id
        )
    reservation = _new_reservation(
        account_id=account_id, amount=amount, model=model, api_key_id=api_key_id, request_id=request_id
    )
    return _held(reservation, await ledger_sql.execute_async(_reserve_statement(reservation)))


def _claim(reservation_id: UUID | str, status: str) -> Reservation | None:
    """Move a held reservation to `status`; None when another path already closed it."""
    claimed = Reservation.objects.filter(pk=reservation_id, status=Reservation.Status.HELD).update(
        status=status, closed_at=timezone.now()
    )
    if claimed != 1:
        return None
    return Reservation.objects.get(pk=reservation_id)


def reservation_settle(
    *,
    reservation_id: UUID | str,
    prompt_tokens: int,
    completion_tokens: int,
    outcome: Outcome,
    status: str = UsageRecord.Status.OK,
) -> UsageRecord | None:
    """Charge the actual cost from authoritative usage and return the rest.

    Idempotent: a second call (or one after release/expiry) charges nothing and
    returns None. A cost above the reservation is charged in full and recorded
    as an overrun: the worker's usage is authoritative.
    """
    if prompt_tokens < 0 or completion_tokens < 0:
        raise InvalidAmount("token counts must not be negative")
    if connection.vendor == "postgresql":
        statement = _settle_statement(reservation_id, prompt_tokens, completion_tokens, outcome, status)
        return _notified(ledger_sql.execute(statement), on_commit=True)
    with transaction.atomic(durable=True):
        reservation = _claim(reservation_id, Reservation.Status.SETTLED)
        if reservation is None:
            return None
        cost = cost_of(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            input_price=reservation.input_price,
            output_price=reservation.output_price,
        )
        Account.objects.filter(pk=reservation.account_id).update(
            available=F("available") + reservation.amount - cost, reserved=F("reserved") - reservation.amount
        )
        _ledger(
            account_id=reservation.account_id,
            kind=LedgerEntry.Kind.SETTLE,
            amount=cost,
            available_delta=reservation.amount - cost,
            reserved_delta=-reservation.amount,
            reference=str(reservation.pk),
            actor="gateway",
        )
        record = _usage_create(
            reservation,
            outcome,
            status=status,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost=cost,
            overrun=max(0, cost - reservation.amount),
        )
        _notify_on_commit(record)
    return record


def _usage_create(reservation: Reservation, outcome: Outcome, *, status: str, **fields: Any) -> UsageRecord:
    """The ORM path's usage row: what the reservation and the outcome say, plus the charge `fields`."""
    return UsageRecord.objects.create(
        account_id=reservation.account_id,
        api_key_id=reservation.api_key_id,
        reservation=reservation,
        request_id=reservation.request_id,
        endpoint=outcome.endpoint,
        model_id=reservation.model_id,
        worker_id=outcome.worker_id,
        reserved=reservation.amount,
        latency_ms=outcome.latency_ms,
        ttft_ms=outcome.ttft_ms,
        streamed=outcome.streamed,
        status=status,
        **fields,
    )


def _return_held(reservation: Reservation, *, kind: str, actor: str, note: str = "") -> None:
    Account.objects.filter(pk=reservation.account_id).update(
        available=F("available") + reservation.amount, reserved=F("reserved") - reservation.amount
    )
    _ledger(
        account_id=reservation.account_id,
        kind=kind,
        amount=reservation.amount,
        available_delta=reservation.amount,
        reserved_delta=-reservation.amount,
        reference=str(reservation.pk),
        actor=actor,
        note=note,
    )


def reservation_release(
    *, reservation_id: UUID | str, error_code: str = "", outcome: Outcome | None = None
) -> UsageRecord | None:
    """Return the whole reservation, charging nothing. Idempotent.

    With an error code, a zero-cost usage record keeps the failed request
    visible to the customer and to staff.
    """
    if connection.vendor == "postgresql":
        return _notified(ledger_sql.execute(_release_statement(reservation_id, error_code, outcome)), on_commit=True)
    with transaction.atomic(durable=True):
        reservation = _claim(reservation_id, Reservation.Status.RELEASED)
        if reservation is None:
            return None
        _return_held(reservation, kind=LedgerEntry.Kind.RELEASE, actor="gateway", note=error_code)
        if not error_code:
            return None
        record = _usage_create(
            reservation, outcome or Outcome(), status=UsageRecord.Status.FAILED, error_code=error_code
        )
        _notify_on_commit(record)
    return record


def _settle_statement(
    reservation_id: UUID | str, prompt_tokens: int, completion_tokens: int, outcome: Outcome, status: str
) -> ledger_sql.Statement:
    if prompt_tokens < 0 or completion_tokens < 0:
        raise InvalidAmount("token counts must not be negative")
    return ledger_sql.close(
        reservation_id=reservation_id,
        status=Reservation.Status.SETTLED,
        kind=LedgerEntry.Kind.SETTLE,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        now=timezone.now(),
        usage=_usage_params(outcome, status=status, error_code=""),
    )


def _release_statement(reservation_id: UUID | str, error_code: str, outcome: Outcome | None) -> ledger_sql.Statement:
    usage = None
    if error_code:
        usage = _usage_params(outcome or Outcome(), status=UsageRecord.Status.FAILED, error_code=error_code)
    return ledger_sql.close(
        reservation_id=reservation_id,
        status=Reservation.Status.RELEASED,
        kind=LedgerEntry.Kind.RELEASE,
        prompt_tokens=0,
        completion_tokens=0,
        now=timezone.now(),
        note=error_code,
        usage=usage,
    )


def _notified(found: object, *, on_commit: bool) -> UsageRecord | None:
    if not isinstance(found, UsageRecord):
        return None
    if on_commit:
        _notify_on_commit(found)
    else:  # the pooled statement has committed already
        for listener in usage_listeners:
            listener(found)
    return found


async def reservation_settle_async(
    *,
    reservation_id: UUID | str,
    prompt_tokens: int,
    completion_tokens: int,
    outcome: Outcome,
    status: str = UsageRecord.Status.OK,
) -> UsageRecord | None:
    """reservation_settle for the event loop: on PostgreSQL one pooled statement, no thread hop."""
    if connection.vendor != "postgresql":
        return await db_call(reservation_settle)(
            reservation_id=reservation_id,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            outcome=outcome,
            status=status,
        )
    statement = _settle_statement(reservation_id, prompt_tokens, completion_tokens, outcome, status)
    return _notified(await ledger_sql.execute_async(statement), on_commit=False)


async def reservation_release_async(
    *, reservation_id: UUID | str, error_code: str = "", outcome: Outcome | None = None
) -> UsageRecord | None:
    """reservation_release for the event loop: on PostgreSQL one pooled statement, no thread hop."""
    if connection.vendor != "postgresql":
        return await db_call(reservation_release)(reservation_id=reservation_id, error_code=error_code, outcome=outcome)
    statement = _release_statement(reservation_id, error_code, outcome)
    return _notified(await ledger_sql.execute_async(statement), on_commit=False)


def reservations_expire(*, older_than: timedelta) -> int:
    """Release reservations held longer than `older_than` (their process died).

    Each is claimed with a conditional update, so a late settle or a second
    sweeper racing this one charges or releases it exactly once.
    """
    cutoff = timezone.now() - older_than
    stale = list(
        Reservation.objects.filter(status=Reservation.Status.HELD, created_at__lt=cutoff).values_list("pk", flat=True)[
            :10_000
        ]
    )
    expired = 0
    for reservation_id in stale:
        with transaction.atomic(durable=True):
            reservation = _claim(reservation_id, Reservation.Status.EXPIRED)
            if reservation is None:
                continue
            _return_held(reservation, kind=LedgerEntry.Kind.EXPIRE, actor="sweeper", note=f"held over {older_than}")
            expired += 1
    return expired


def model_register(
    *,
    model_id: str,
    input_price: int,
    output_price: int,
    max_output_tokens: int | None = None,
    actor: object = "",
    via: str = "",
) -> tuple[PublicModel, bool]:
    """Create or update a public model. Prices in micro-credits per 1,000,000 tokens.

    With an `actor`, the change (and the previous prices) is audited in its transaction."""
    from django.core.exceptions import ValidationError

    from accounts.services import audit_record

    model_id = model_id.strip()
    if not model_id:
        raise ValidationError({"model_id": "must not be empty"})
    if max_output_tokens is not None and max_output_tokens < 1:
        raise ValidationError({"max_output_tokens": "must be a positive integer"})
    with transaction.atomic():
        model = PublicModel.objects.select_for_update().filter(model_id=model_id).first()
        created = model is None
        if model is None:
            model = PublicModel(model_id=model_id, max_output_tokens=settings.SPEEDINFER_DEFAULT_MAX_OUTPUT_TOKENS)
        previous = (model.input_price, model.output_price)
        model.input_price = input_price
        model.output_price = output_price
        if max_output_tokens is not None:
            model.max_output_tokens = max_output_tokens
        model.full_clean()
        model.save()
        if actor:
            detail: dict[str, object] = {
                "input_price": format_credits(input_price),
                "output_price": format_credits(output_price),
                "max_output_tokens": model.max_output_tokens,
            }
            if not created:
                detail["previous_input_price"] = format_credits(previous[0])
                detail["previous_output_price"] = format_credits(previous[1])
            if via:
                detail["via"] = via
            action = "model.create" if created else "model.update"
            audit_record(actor=actor, action=action, target=model, detail=detail)
    return model, created
