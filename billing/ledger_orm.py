"""The ORM money engine: the embedded SQLite's (and any non-PostgreSQL database's) reserve, settle,
release and expire, as short transactions. billing.services chooses it; billing.ledger_sql is the
PostgreSQL engine with the same invariants in single statements.

Each operation changes the account row with a conditional UPDATE (never read-then-write), claims a
reservation's state change with a conditional UPDATE and a row-count check, and appends a ledger row
with the balances after. No network I/O happens inside these transactions.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from accounts.models import Account
from billing.ledger_sql import ReserveResult, month_start
from billing.models import KeySpend, LedgerEntry, Reservation, UsageRecord
from billing.pricing import cost_of


class _OverBudget(Exception):
    """Rolls back a reservation whose key's monthly budget would be exceeded."""


def ledger_append(
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
    """Append a ledger row with the balances after; call inside the transaction that changed them."""
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


def _key_spend_hold(reservation: Reservation, budget: int | None) -> None:
    """Add the hold to the key's month row, within `budget` if any; inside the reserve's transaction."""
    if reservation.api_key_id is None:
        return
    month = month_start(reservation.created_at)
    KeySpend.objects.get_or_create(api_key_id=reservation.api_key_id, month=month)
    rows = KeySpend.objects.filter(api_key_id=reservation.api_key_id, month=month)
    if budget is not None:
        rows = rows.filter(spent__lte=budget - reservation.amount - F("reserved"))
    if rows.update(reserved=F("reserved") + reservation.amount) != 1:
        raise _OverBudget


def _key_spend_close(reservation: Reservation, *, held: int, charged: int) -> None:
    """Move a closed reservation's hold (`held`: none left after an expiry) out of the key's month
    row and what was `charged` into spent."""
    if reservation.api_key_id is None:
        return
    KeySpend.objects.filter(api_key_id=reservation.api_key_id, month=month_start(reservation.created_at)).update(
        reserved=F("reserved") - held, spent=F("spent") + charged
    )


def reserve(reservation: Reservation, *, budget: int | None = None) -> ReserveResult:
    """Hold reservation.amount and save the reservation, or say why it does not fit."""
    amount = reservation.amount
    try:
        with transaction.atomic(durable=True):
            return _reserve(reservation, amount, budget)
    except _OverBudget:
        available = Account.objects.values_list("available", flat=True).get(pk=reservation.account_id)
        return ReserveResult(held=False, refusal="key_budget_exceeded", available=available)


def _reserve(reservation: Reservation, amount: int, budget: int | None) -> ReserveResult:
    held_rows = Account.objects.filter(pk=reservation.account_id, available__gte=amount).update(
        available=F("available") - amount, reserved=F("reserved") + amount
    )
    if held_rows != 1:
        available = Account.objects.values_list("available", flat=True).get(pk=reservation.account_id)
        return ReserveResult(held=False, refusal="insufficient_credits", available=available)
    _key_spend_hold(reservation, budget)  # raises _OverBudget, which rolls the account's UPDATE back
    reservation.save(force_insert=True)
    ledger_append(
        account_id=reservation.account_id,
        kind=LedgerEntry.Kind.RESERVE,
        amount=amount,
        available_delta=-amount,
        reserved_delta=amount,
        reference=str(reservation.pk),
        actor="gateway",
    )
    return ReserveResult(held=True)


def _claim(reservation_id: UUID | str, status: str, *, lease_passed_at: datetime | None = None) -> Reservation | None:
    """Move a held reservation to `status`; None when another path already closed it (or, with
    `lease_passed_at`, when its request renewed the lease meanwhile)."""
    rows = Reservation.objects.filter(pk=reservation_id, status=Reservation.Status.HELD)
    if lease_passed_at is not None:
        rows = rows.filter(Q(lease_until__isnull=True) | Q(lease_until__lt=lease_passed_at))
    claimed = rows.update(status=status, closed_at=timezone.now())
    if claimed != 1:
        return None
    return Reservation.objects.get(pk=reservation_id)


def _usage_create(reservation: Reservation, usage: dict[str, Any], **charge: Any) -> UsageRecord:
    return UsageRecord.objects.create(
        account_id=reservation.account_id,
        api_key_id=reservation.api_key_id,
        reservation=reservation,
        request_id=reservation.request_id,
        model_id=reservation.model_id,
        reserved=reservation.amount,
        **usage,
        **charge,
    )


def _claim_for_settle(reservation_id: UUID | str) -> tuple[Reservation, bool] | None:
    """Claim a reservation for its settle: a held one, or one the sweeper expired meanwhile (its
    content must still be paid for). The flag says whether it was still held."""
    reservation = _claim(reservation_id, Reservation.Status.SETTLED)
    if reservation is not None:
        return reservation, True
    # An expired one keeps its expiry time as closed_at.
    late = Reservation.objects.filter(pk=reservation_id, status=Reservation.Status.EXPIRED).update(
        status=Reservation.Status.SETTLED
    )
    return (Reservation.objects.get(pk=reservation_id), False) if late == 1 else None


def settle(
    *, reservation_id: UUID | str, prompt_tokens: int, completion_tokens: int, usage: dict[str, Any]
) -> UsageRecord | None:
    """Charge the cost of the counts, return the rest of the hold, append the usage row.

    The charge is capped at what the account can pay (the hold plus what is available); the rest
    is recorded as `uncharged` on the usage row and in the ledger row's note, never overdrawn."""
    with transaction.atomic(durable=True):
        claimed = _claim_for_settle(reservation_id)
        if claimed is None:
            return None
        reservation, was_held = claimed
        held = reservation.amount if was_held else 0
        cost = cost_of(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            input_price=reservation.input_price,
            output_price=reservation.output_price,
        )
        # The claim's UPDATE already holds the write lock (SQLite) and select_for_update locks the
        # row elsewhere, so this balance is the one the UPDATE below changes.
        available = (
            Account.objects.select_for_update().filter(pk=reservation.account_id).values_list("available", flat=True)
        ).get()
        charged = min(cost, held + available)
        Account.objects.filter(pk=reservation.account_id).update(
            available=F("available") + held - charged, reserved=F("reserved") - held
        )
        ledger_append(
            account_id=reservation.account_id,
            kind=LedgerEntry.Kind.SETTLE,
            amount=charged,
            available_delta=held - charged,
            reserved_delta=-held,
            reference=str(reservation.pk),
            actor="gateway",
            note=settle_note(was_held=was_held, uncharged=cost - charged),
        )
        _key_spend_close(reservation, held=held, charged=charged)
        record = _usage_create(
            reservation,
            usage,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost=charged,
            overrun=max(0, cost - reservation.amount),
            uncharged=cost - charged,
        )
    return record


def settle_note(*, was_held: bool, uncharged: int) -> str:
    """The settle ledger row's note; ledger_sql writes the same words."""
    parts = [] if was_held else ["settled after the reservation expired"]
    if uncharged > 0:
        parts.append(f"uncharged overrun {uncharged} micro-credits")
    return "; ".join(parts)


def return_held(reservation: Reservation, *, kind: str, actor: str, note: str = "") -> None:
    Account.objects.filter(pk=reservation.account_id).update(
        available=F("available") + reservation.amount, reserved=F("reserved") - reservation.amount
    )
    _key_spend_close(reservation, held=reservation.amount, charged=0)  # after the account: the lock order
    ledger_append(
        account_id=reservation.account_id,
        kind=kind,
        amount=reservation.amount,
        available_delta=reservation.amount,
        reserved_delta=-reservation.amount,
        reference=str(reservation.pk),
        actor=actor,
        note=note,
    )


def release(*, reservation_id: UUID | str, note: str, usage: dict[str, Any] | None) -> UsageRecord | None:
    """Return the whole hold; with `usage`, append a zero-cost usage row (a failed request stays visible)."""
    with transaction.atomic(durable=True):
        reservation = _claim(reservation_id, Reservation.Status.RELEASED)
        if reservation is None:
            return None
        return_held(reservation, kind=LedgerEntry.Kind.RELEASE, actor="gateway", note=note)
        if usage is None:
            return None
        return _usage_create(reservation, usage)


def expire(reservation_id: UUID | str, *, note: str, now: datetime) -> bool:
    """The sweeper's release of one reservation whose process died; False when it was closed (or its
    lease renewed) meanwhile."""
    with transaction.atomic(durable=True):
        reservation = _claim(reservation_id, Reservation.Status.EXPIRED, lease_passed_at=now)
        if reservation is None:
            return False
        return_held(reservation, kind=LedgerEntry.Kind.EXPIRE, actor="sweeper", note=note)
    return True
