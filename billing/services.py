"""Writes that move money: grant, reserve, settle, release, expire. The one interface to the ledger.

The engines behind it keep the same invariants and are chosen by the database: on PostgreSQL the
gateway's reserve, settle and release are one statement each (billing.ledger_sql, on the event
loop's pool for the async variants); on the embedded SQLite the sync callers use the ORM
transactions of billing.ledger_orm and the event loop the plain-statement transactions of
billing.ledger_sqlite on the process's own connection (the ORM on a thread cost ~10 ms a request).
Grants and the sweeper's expiry are ORM transactions everywhere. The arithmetic (cost, bounds) is
billing.pricing's; ledger_sql mirrors cost_of in SQL so a settle stays one statement.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from accounts.models import Account
from billing import ledger_orm, ledger_sql, ledger_sqlite
from billing.models import LedgerEntry, Reservation, UsageRecord
from catalog.models import PublicModel
from core.audit import actor_name, audit_record
from core.credits import format_credits
from core.db import db_write_call
from core.outcome import RequestOutcome

# Called with the UsageRecord after its transaction commits (live dashboard,
# metrics). Registered by the apps that want it, so billing imports none of them.
usage_listeners: list[Callable[[UsageRecord], None]] = []

# A running request's reservation is leased: set when it is held, pushed forward by the gateway
# every LEASE_RENEW_EVERY while the request runs. The sweeper never expires a reservation whose
# lease has not passed, however old it is; a process that died stops renewing, and its holds go.
LEASE = timedelta(seconds=90)
LEASE_RENEW_EVERY = timedelta(seconds=30)
# Token counts above this are not believed (a worker's bug, or an overflow): the request is a
# clean runtime_usage_unavailable and nothing is charged. Well under 2^31 (the usage columns).
MAX_TOKEN_COUNT = 1_000_000_000


class InsufficientCredits(Exception):
    """The account's available credits do not cover the amount; `needed` and `available` in micro-credits."""

    def __init__(self, message: str = "insufficient credits", *, needed: int = 0, available: int = 0) -> None:
        super().__init__(message)
        self.needed = needed
        self.available = available


class KeyBudgetExceeded(Exception):
    """The reservation does not fit what is left of the key's monthly budget."""


class InvalidAmount(ValueError):
    pass


@functools.cache
def _vendor() -> str:
    return connection.vendor  # read per call it was 2% of the gateway's CPU (a thread-local lookup)


def _single_statements() -> bool:
    """Whether this database runs the money path as single statements (PostgreSQL's CTEs)."""
    return _vendor() == "postgresql"


def _gateway_sqlite() -> bool:
    """Whether the event loop's money calls go to the SQLite engine (billing.ledger_sqlite)."""
    return _vendor() == "sqlite"


def usage_fields(outcome: RequestOutcome | None, *, status: str, error_code: str = "") -> dict[str, Any]:
    """The usage row's columns that come from how the request ended (the rest come from the reservation)."""
    outcome = outcome or RequestOutcome(request_id="", latency=0.0)
    return {
        "endpoint": outcome.endpoint,
        "worker_id": outcome.worker_id,
        "latency_ms": outcome.latency_ms(),
        "ttft_ms": outcome.ttft_ms(),
        "queue_wait_ms": outcome.queue_wait_ms,
        "streamed": outcome.streamed,
        "status": status,
        "error_code": error_code,
    }


def _notify(record: UsageRecord | None, *, committed: bool) -> UsageRecord | None:
    if record is None:
        return None

    def fire() -> None:
        for listener in usage_listeners:
            listener(record)

    if committed:  # a pooled statement has committed already
        fire()
    else:
        transaction.on_commit(fire)
    return record


def _as_usage(found: object) -> UsageRecord | None:
    return found if isinstance(found, UsageRecord) else None


def credits_grant(*, account: Account, amount: int, actor: object, note: str = "", via: str = "") -> LedgerEntry:
    """Add (or, negative, remove) available credits. A removal never takes available below zero.

    `actor` (a staff user, a command's name) is written on the ledger row and, with the amount and
    note, on an audit row in the same transaction."""
    if amount == 0:
        raise InvalidAmount("amount must not be zero")
    with transaction.atomic(durable=True):
        rows = Account.objects.filter(pk=account.pk)
        if amount < 0:
            rows = rows.filter(available__gte=-amount)
        if rows.update(available=F("available") + amount) != 1:
            available = Account.objects.filter(pk=account.pk).values_list("available", flat=True).first() or 0
            raise InsufficientCredits(
                f"account {account.name!r} has {format_credits(available)} credits available,"
                f" less than the {format_credits(-amount)} to remove",
                needed=-amount,
                available=available,
            )
        entry = ledger_orm.ledger_append(
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
        created_at=(now := timezone.now()),
        lease_until=now + LEASE,
    )


def _reserve_statement(reservation: Reservation, budget: int | None) -> ledger_sql.Statement:
    return ledger_sql.reserve(
        budget=budget,
        reservation_id=reservation.id,
        account_id=reservation.account_id,
        api_key_id=reservation.api_key_id,
        model_id=reservation.model_id,
        amount=reservation.amount,
        input_price=reservation.input_price,
        output_price=reservation.output_price,
        request_id=reservation.request_id,
        now=reservation.created_at,
        lease_until=reservation.lease_until,
    )


def _held(reservation: Reservation, result: object) -> Reservation:
    if not isinstance(result, ledger_sql.ReserveResult):
        raise TypeError(f"a reserve returned {result!r}")
    if result.refusal == "key_budget_exceeded":
        raise KeyBudgetExceeded("this request's reservation does not fit what is left of the key's monthly budget")
    if not result.held:
        raise InsufficientCredits(
            f"this request needs {format_credits(reservation.amount)} credits reserved; "
            f"{format_credits(result.available)} available",
            needed=reservation.amount,
            available=result.available,
        )
    reservation._state.adding = False
    return reservation


def credits_reserve(
    *,
    account_id: int,
    amount: int,
    model: PublicModel,
    api_key_id: int | None = None,
    request_id: str = "",
    budget: int | None = None,
) -> Reservation:
    """Hold `amount` micro-credits for one request, or raise InsufficientCredits.

    With `budget` (the key's monthly cap), raises KeyBudgetExceeded when the key's spend this month
    plus its running holds plus `amount` would pass it; decided in the same statement/transaction."""
    reservation = _new_reservation(
        account_id=account_id, amount=amount, model=model, api_key_id=api_key_id, request_id=request_id
    )
    if _single_statements():
        return _held(reservation, ledger_sql.execute(_reserve_statement(reservation, budget)))
    return _held(reservation, ledger_orm.reserve(reservation, budget=budget))


async def credits_reserve_async(
    *,
    account_id: int,
    amount: int,
    model: PublicModel,
    api_key_id: int | None = None,
    request_id: str = "",
    budget: int | None = None,
) -> Reservation:
    """credits_reserve for the event loop: on PostgreSQL one pooled statement, no thread hop."""
    reservation = _new_reservation(
        account_id=account_id, amount=amount, model=model, api_key_id=api_key_id, request_id=request_id
    )
    if _single_statements():
        return _held(reservation, await ledger_sql.execute_async(_reserve_statement(reservation, budget)))
    if _gateway_sqlite():
        return _held(reservation, await ledger_sqlite.reserve(reservation, budget=budget))
    return _held(reservation, await db_write_call(ledger_orm.reserve)(reservation, budget=budget))


def _settle_statement(
    reservation_id: UUID | str, prompt_tokens: int, completion_tokens: int, usage: dict[str, Any]
) -> ledger_sql.Statement:
    return ledger_sql.close(
        reservation_id=reservation_id,
        status=Reservation.Status.SETTLED,
        kind=LedgerEntry.Kind.SETTLE,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        now=timezone.now(),
        usage=usage,
    )


def _release_statement(reservation_id: UUID | str, note: str, usage: dict[str, Any] | None) -> ledger_sql.Statement:
    return ledger_sql.close(
        reservation_id=reservation_id,
        status=Reservation.Status.RELEASED,
        kind=LedgerEntry.Kind.RELEASE,
        prompt_tokens=0,
        completion_tokens=0,
        now=timezone.now(),
        note=note,
        usage=usage,
    )


def _check_counts(prompt_tokens: int, completion_tokens: int) -> None:
    for count in (prompt_tokens, completion_tokens):
        if type(count) is not int or not 0 <= count <= MAX_TOKEN_COUNT:
            raise InvalidAmount(f"token counts must be integers from 0 to {MAX_TOKEN_COUNT}")


def reservation_settle(
    *,
    reservation_id: UUID | str,
    prompt_tokens: int,
    completion_tokens: int,
    outcome: RequestOutcome | None = None,
    status: str = UsageRecord.Status.OK,
) -> UsageRecord | None:
    """Charge the actual cost from authoritative usage and return the rest.

    Idempotent: a second call (or one after a release) charges nothing and
    returns None. One after the sweeper expired the reservation still charges
    (from available: content is never free). The charge is capped at what the
    account can pay (the hold plus available); a cost above the reservation is
    recorded as `overrun`, and what could not be charged as `uncharged`.
    """
    _check_counts(prompt_tokens, completion_tokens)
    usage = usage_fields(outcome, status=status)
    if _single_statements():
        found = ledger_sql.execute(_settle_statement(reservation_id, prompt_tokens, completion_tokens, usage))
        return _notify(_as_usage(found), committed=False)
    record = ledger_orm.settle(
        reservation_id=reservation_id, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, usage=usage
    )
    return _notify(record, committed=True)


async def reservation_settle_async(
    *,
    reservation_id: UUID | str,
    prompt_tokens: int,
    completion_tokens: int,
    outcome: RequestOutcome | None = None,
    status: str = UsageRecord.Status.OK,
) -> UsageRecord | None:
    """reservation_settle for the event loop: on PostgreSQL one pooled statement, no thread hop."""
    if _gateway_sqlite():
        _check_counts(prompt_tokens, completion_tokens)
        record = await ledger_sqlite.settle(
            reservation_id=reservation_id,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            usage=usage_fields(outcome, status=status),
        )
        return _notify(record, committed=True)
    if not _single_statements():
        return await db_write_call(reservation_settle)(
            reservation_id=reservation_id,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            outcome=outcome,
            status=status,
        )
    _check_counts(prompt_tokens, completion_tokens)
    statement = _settle_statement(
        reservation_id, prompt_tokens, completion_tokens, usage_fields(outcome, status=status)
    )
    return _notify(_as_usage(await ledger_sql.execute_async(statement)), committed=True)


def _release_usage(error_code: str, outcome: RequestOutcome | None) -> dict[str, Any] | None:
    return usage_fields(outcome, status=UsageRecord.Status.FAILED, error_code=error_code) if error_code else None


def reservation_release(
    *, reservation_id: UUID | str, error_code: str = "", outcome: RequestOutcome | None = None
) -> UsageRecord | None:
    """Return the whole reservation, charging nothing. Idempotent.

    With an error code, a zero-cost usage record keeps the failed request
    visible to the customer and to staff.
    """
    usage = _release_usage(error_code, outcome)
    if _single_statements():
        found = ledger_sql.execute(_release_statement(reservation_id, error_code, usage))
        return _notify(_as_usage(found), committed=False)
    record = ledger_orm.release(reservation_id=reservation_id, note=error_code, usage=usage)
    return _notify(record, committed=True)


async def reservation_release_async(
    *, reservation_id: UUID | str, error_code: str = "", outcome: RequestOutcome | None = None
) -> UsageRecord | None:
    """reservation_release for the event loop: on PostgreSQL one pooled statement, no thread hop."""
    if _gateway_sqlite():
        usage = _release_usage(error_code, outcome)
        record = await ledger_sqlite.release(reservation_id=reservation_id, note=error_code, usage=usage)
        return _notify(record, committed=True)
    if not _single_statements():
        return await db_write_call(reservation_release)(
            reservation_id=reservation_id, error_code=error_code, outcome=outcome
        )
    statement = _release_statement(reservation_id, error_code, _release_usage(error_code, outcome))
    return _notify(_as_usage(await ledger_sql.execute_async(statement)), committed=True)


def reservations_expire(*, older_than: timedelta) -> int:
    """Release reservations held longer than `older_than` whose lease has passed (their process died).

    Each is claimed with a conditional update (still held, lease still passed), so a late settle, a
    lease renewal or a second sweeper racing this one charges or releases it exactly once.
    """
    now = timezone.now()
    stale = (
        Reservation.objects.filter(status=Reservation.Status.HELD, created_at__lt=now - older_than)
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
        .values_list("pk", flat=True)[:10_000]
    )
    return sum(
        ledger_orm.expire(reservation_id, note=f"held over {older_than}", now=now) for reservation_id in list(stale)
    )


def reservation_renew(*, reservation_id: UUID | str) -> bool:
    """Push a held reservation's lease forward (its request is still running); False once it is closed."""
    return bool(
        Reservation.objects.filter(pk=reservation_id, status=Reservation.Status.HELD).update(
            lease_until=timezone.now() + LEASE
        )
    )


async def reservation_renew_async(*, reservation_id: UUID | str) -> bool:
    if _gateway_sqlite():
        return await ledger_sqlite.renew(reservation_id=reservation_id, lease_until=timezone.now() + LEASE)
    return await db_write_call(reservation_renew)(reservation_id=reservation_id)
