"""Writes that move money: grant, reserve, settle, release, renew, expire. The one entry to the ledger.

The money moves in billing.ledger's implementation for this process's database, chosen once at
start-up (PostgreSQL: one statement each; SQLite: plain statements in one write transaction); see
that package for the rules and what each relies on. Here: the reservation's fields, the token
counts' bounds, a refusal's exception and message, and the usage listeners. Grants are ORM
transactions everywhere (with their audit row). The `_async` functions are the gateway's; the sync
ones serve the admin, the commands, the sweeper's task and the tests, on the same implementation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from accounts.models import Account
from billing.ledger import ReserveResult, ledger
from billing.models import LedgerEntry, Reservation, UsageRecord
from catalog.models import PublicModel
from core.audit import actor_name, audit_record
from core.credits import format_credits
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
    """The reservation does not fit what is left of the key's monthly budget; `needed` and `left` in micro-credits."""

    def __init__(self, message: str = "key budget exceeded", *, needed: int = 0, left: int = 0) -> None:
        super().__init__(message)
        self.needed = needed
        self.left = left


class InvalidAmount(ValueError):
    pass


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
        # Our UPDATE holds the account row's lock until commit: these are the balances it produced.
        available, reserved = Account.objects.filter(pk=account.pk).values_list("available", "reserved").get()
        entry = LedgerEntry.objects.create(
            account_id=account.pk,
            kind=LedgerEntry.Kind.GRANT,
            amount=amount,
            available_delta=amount,
            reserved_delta=0,
            available_after=available,
            reserved_after=reserved,
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
        cached_input_price=model.cached_input_price_or_input,
        request_id=request_id,
        created_at=(now := timezone.now()),
        lease_until=now + LEASE,
    )


def _held(reservation: Reservation, result: ReserveResult) -> Reservation:
    if result.refusal == "key_budget_exceeded":
        raise KeyBudgetExceeded(
            f"this request needs {format_credits(reservation.amount)} credits reserved; "
            f"{format_credits(result.budget_left)} left of the key's monthly budget",
            needed=reservation.amount,
            left=result.budget_left,
        )
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
    return _held(reservation, ledger().reserve(reservation, budget=budget))


async def credits_reserve_async(
    *,
    account_id: int,
    amount: int,
    model: PublicModel,
    api_key_id: int | None = None,
    request_id: str = "",
    budget: int | None = None,
) -> Reservation:
    """credits_reserve for the event loop (the gateway's request_reserve)."""
    reservation = _new_reservation(
        account_id=account_id, amount=amount, model=model, api_key_id=api_key_id, request_id=request_id
    )
    return _held(reservation, await ledger().reserve_async(reservation, budget=budget))


def _check_counts(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0, reasoning_tokens: int = 0
) -> None:
    for count in (prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens):
        if type(count) is not int or not 0 <= count <= MAX_TOKEN_COUNT:
            raise InvalidAmount(f"token counts must be integers from 0 to {MAX_TOKEN_COUNT}")
    if cached_tokens > prompt_tokens or reasoning_tokens > completion_tokens:
        raise InvalidAmount("cached tokens are prompt tokens, reasoning tokens completion tokens: not more of them")


def reservation_settle(
    *,
    reservation_id: UUID | str,
    prompt_tokens: int,
    completion_tokens: int,
    outcome: RequestOutcome | None = None,
    status: str = UsageRecord.Status.OK,
    cached_tokens: int = 0,
    reasoning_tokens: int = 0,
) -> UsageRecord | None:
    """Charge the actual cost from authoritative usage and return the rest.

    Idempotent: a second call (or one after a release) charges nothing and
    returns None. One after the sweeper expired the reservation still charges
    (from available: content is never free). The charge is capped at what the
    account can pay (the hold plus available) and at what is left of the key's
    monthly budget beside its other running holds; a cost above the reservation
    is recorded as `overrun`, and what could not be charged as `uncharged`.
    `cached_tokens` (of the prompt) are priced at the reservation's cached input
    price; `reasoning_tokens` (of the completion) are recorded only.
    """
    _check_counts(prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens)
    record = ledger().settle(
        reservation_id=reservation_id,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_tokens=cached_tokens,
        usage=usage_fields(outcome, status=status) | {"reasoning_tokens": reasoning_tokens},
    )
    return _notify(record, committed=False)


async def reservation_settle_async(
    *,
    reservation_id: UUID | str,
    prompt_tokens: int,
    completion_tokens: int,
    outcome: RequestOutcome | None = None,
    status: str = UsageRecord.Status.OK,
    cached_tokens: int = 0,
    reasoning_tokens: int = 0,
    account_id: int | None = None,
) -> UsageRecord | None:
    """reservation_settle for the event loop (the gateway's); `account_id`, the reservation's account
    when the caller knows it, paces that account's statements (billing.ledger.postgresql)."""
    _check_counts(prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens)
    record = await ledger().settle_async(
        reservation_id=reservation_id,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_tokens=cached_tokens,
        usage=usage_fields(outcome, status=status) | {"reasoning_tokens": reasoning_tokens},
        account_id=account_id,
    )
    return _notify(record, committed=True)


def _release_usage(error_code: str, outcome: RequestOutcome | None) -> dict[str, Any] | None:
    if not error_code:
        return None
    # A client that left before anything was delivered is not a failed request: its record says so.
    disconnected = error_code == UsageRecord.Status.CLIENT_DISCONNECTED
    status = UsageRecord.Status.CLIENT_DISCONNECTED if disconnected else UsageRecord.Status.FAILED
    return usage_fields(outcome, status=status, error_code=error_code)


def reservation_release(
    *, reservation_id: UUID | str, error_code: str = "", outcome: RequestOutcome | None = None
) -> UsageRecord | None:
    """Return the whole reservation, charging nothing. Idempotent.

    With an error code, a zero-cost usage record keeps the failed request
    visible to the customer and to staff.
    """
    usage = _release_usage(error_code, outcome)
    return _notify(ledger().release(reservation_id=reservation_id, note=error_code, usage=usage), committed=False)


async def reservation_release_async(
    *,
    reservation_id: UUID | str,
    error_code: str = "",
    outcome: RequestOutcome | None = None,
    account_id: int | None = None,
) -> UsageRecord | None:
    """reservation_release for the event loop (the gateway's)."""
    usage = _release_usage(error_code, outcome)
    record = await ledger().release_async(
        reservation_id=reservation_id, note=error_code, usage=usage, account_id=account_id
    )
    return _notify(record, committed=True)


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
    note = f"held over {older_than}"
    return sum(ledger().expire(reservation_id=pk, note=note, now=now) for pk in list(stale))


def reservation_renew(*, reservation_id: UUID | str) -> bool:
    """Push a held reservation's lease forward (its request is still running); False once it is closed."""
    return ledger().renew(reservation_id=reservation_id, lease_until=timezone.now() + LEASE)


async def reservation_renew_many_async(*, reservation_ids: Sequence[UUID | str]) -> None:
    """Renew the leases of every held reservation among `reservation_ids` (proxy.leases, each interval)."""
    await ledger().renew_many_async(reservation_ids=reservation_ids, lease_until=timezone.now() + LEASE)


async def reservation_renew_async(*, reservation_id: UUID | str) -> bool:
    """reservation_renew for the event loop (the gateway's lease keeper)."""
    return await ledger().renew_async(reservation_id=reservation_id, lease_until=timezone.now() + LEASE)
