"""The ledger interface: the money operations, one implementation per database.

billing.services is the only caller: it builds the reservation, checks the token counts, turns a
refusal into InsufficientCredits or KeyBudgetExceeded and notifies usage listeners; a `Ledger` moves
the money. Every implementation keeps the same rules: available never below zero (a conditional
UPDATE or a row lock decides), a key's monthly budget decided in the reservation's own transaction,
a settle's charge capped at what the account can pay and at what is left of the key's monthly budget
beside its other running holds (the rest recorded as `uncharged`, a cost above the hold as
`overrun`), a late settle after the sweeper's expiry still charged (from available),
every close claimed exactly once (a second settle or release charges nothing), the ledger row
written with the balances after, and no network I/O inside a transaction. The CHECK constraints in
billing.models back these up.

How the implementation is chosen: once per process, by the default connection's vendor
(`connection.vendor` comes from the configured backend, no connection is opened), in
BillingConfig.ready(); `ledger()` returns that one object and never decides again.

- PostgreSQL (billing.ledger.postgresql): reserve, settle, release, renew and expire are one
  statement each; the data-modifying CTEs take the account's row lock (a conditional UPDATE or
  FOR UPDATE) and, with a budget, the key month row's (ON CONFLICT DO UPDATE ... WHERE), so a
  statement is its own transaction. The sync methods run it on Django's connection (admin,
  commands, Celery tasks, tests); the async ones on the event loop's psycopg pool (core.pgpool),
  no thread hop, psycopg's errors translated to core.outages.DatabaseUnavailable.
- SQLite (billing.ledger.sqlite): each operation is a handful of plain statements in one write
  transaction (SQLite has one writer at a time). The async methods run them on the event loop, on
  a connection the process owns (`BEGIN IMMEDIATE`; a busy database is waited for with short
  sleeps, never by blocking the loop, then DatabaseUnavailable); the sync methods run the same
  statements on Django's connection in `transaction.atomic`, so they see the caller's
  transaction. One copy of the SQL serves both.

Grants are not here: they write an audit row in the same transaction (billing.services, the ORM).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any, Protocol
from uuid import UUID

from billing.models import Reservation, UsageRecord


@dataclass(frozen=True, slots=True)
class ReserveResult:
    """A reservation's outcome: held, or why not ("insufficient_credits" or "key_budget_exceeded").

    `available` is the account's balance and `budget_left` what is left of the key's monthly budget
    (for a budget refusal), both for the refusal's message, never used for a decision."""

    held: bool
    refusal: str = ""
    available: int = 0
    budget_left: int = 0


class Ledger(Protocol):
    """The money operations. `usage` is the usage row's columns from how the request ended
    (billing.services.usage_fields); a settle or release returns the usage row it wrote, or None
    when the reservation was already closed (or, for a release, when no usage was given)."""

    vendor: str

    def reserve(self, reservation: Reservation, *, budget: int | None) -> ReserveResult:
        """Hold reservation.amount (within the key's monthly `budget`) and save the reservation."""

    async def reserve_async(self, reservation: Reservation, *, budget: int | None) -> ReserveResult: ...

    def settle(
        self,
        *,
        reservation_id: UUID | str,
        prompt_tokens: int,
        completion_tokens: int,
        usage: dict[str, Any],
        cached_tokens: int = 0,
    ) -> UsageRecord | None:
        """Charge the counts' cost ((prompt - cached) x input + cached x cached input + completion x output),
        capped at what the account can pay and at what is left of the key's monthly budget, and return
        the rest of the hold."""

    async def settle_async(
        self,
        *,
        reservation_id: UUID | str,
        prompt_tokens: int,
        completion_tokens: int,
        usage: dict[str, Any],
        cached_tokens: int = 0,
        account_id: int | None = None,
    ) -> UsageRecord | None:
        """settle on the event loop. `account_id` (the reservation's, when the caller knows it) lets an
        implementation pace one account's statements (the PostgreSQL one does: its row lock)."""

    def release(self, *, reservation_id: UUID | str, note: str, usage: dict[str, Any] | None) -> UsageRecord | None:
        """Return the whole hold; with `usage`, append a zero-cost usage row (a failed request stays visible)."""

    async def release_async(
        self, *, reservation_id: UUID | str, note: str, usage: dict[str, Any] | None, account_id: int | None = None
    ) -> UsageRecord | None: ...

    def renew(self, *, reservation_id: UUID | str, lease_until: datetime) -> bool:
        """Push a held reservation's lease forward; False once it is closed."""

    async def renew_async(self, *, reservation_id: UUID | str, lease_until: datetime) -> bool: ...

    async def renew_many_async(self, *, reservation_ids: Sequence[UUID | str], lease_until: datetime) -> None:
        """Push every still-held reservation of `reservation_ids` forward in one transaction (the
        process's lease keeper: one statement per interval, whatever the number of requests)."""

    def expire(self, *, reservation_id: UUID | str, note: str, now: datetime) -> bool:
        """The sweeper's release of a held reservation whose lease passed before `now`; False when it
        was closed (or its lease renewed) meanwhile."""

    def loop_round_trips(self) -> int:
        """Transactions the async methods sent in this process (Django's query capture does not see
        them: they run on the pool or the process's own connection); the hot path's query-count test."""


def month_start(moment: datetime) -> date:
    """The first day of `moment`'s calendar month in UTC: the key spend row it counts in."""
    return moment.astimezone(UTC).date().replace(day=1)


def settle_note(*, was_held: bool, uncharged: int) -> str:
    """The settle ledger row's note; the PostgreSQL statement writes the same words."""
    parts = [] if was_held else ["settled after the reservation expired"]
    if uncharged > 0:
        parts.append(f"uncharged overrun {uncharged} micro-credits")
    return "; ".join(parts)


_chosen: Ledger | None = None


def choose(vendor: str) -> Ledger:
    """Set this process's ledger for `vendor` (BillingConfig.ready() calls it with the default
    connection's)."""
    global _chosen
    if vendor == "postgresql":
        from billing.ledger.postgresql import PostgreSQLLedger

        _chosen = PostgreSQLLedger()
    elif vendor == "sqlite":
        from billing.ledger.sqlite import SQLiteLedger

        _chosen = SQLiteLedger()
    else:
        raise RuntimeError(f"no ledger for the {vendor!r} database: SpeedInfer runs on PostgreSQL or SQLite")
    return _chosen


def ledger() -> Ledger:
    """This process's ledger, chosen once at start-up."""
    if _chosen is None:  # a script that set Django up without the app registry's ready()
        from django.db import connection

        return choose(connection.vendor)
    return _chosen
