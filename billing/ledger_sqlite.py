"""The gateway's SQLite money engine: reserve, settle, release and renew on one connection that the
gateway process owns, run on its event loop.

The embedded default's ORM engine (billing.ledger_orm) ran on a thread: every statement released and
re-took the GIL against a busy event loop (a convoy of up to the 5 ms switch interval each), and the
ORM's own work was most of a request's cost (make bench, README Performance). Here each operation is
a handful of plain statements in one `BEGIN IMMEDIATE` transaction: SQLite takes one writer at a
time anyway, so one connection per process loses nothing, and the loop is blocked for the few
hundred microseconds a transaction takes. The invariants and the arithmetic are the ORM engine's,
statement for statement (conditional UPDATE of the account, claimed reservation, ledger row with the
balances after, key month row, charge capped at what the account can pay); billing.services chooses
this engine for the async calls on SQLite, and tests/test_ledger_sqlite.py holds it to the same
results as the ORM engine.

Another process (the schedule's sweeper, a management command) may hold SQLite's write lock for a
moment: a busy database is retried with short sleeps on the loop, never by blocking it, for up to
BUSY_WAIT_S; past that the gateway answers 503 (core.outages.DatabaseUnavailable).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar
from uuid import UUID

from django.conf import settings
from django.db import connection as django_connection
from django.utils import timezone

from accounts.models import Account
from billing.ledger_orm import settle_note
from billing.ledger_sql import ReserveResult, month_start
from billing.models import KeySpend, LedgerEntry, Reservation, UsageRecord
from billing.pricing import cost_of
from core.outages import DatabaseUnavailable

T = TypeVar("T")
BUSY_WAIT_S = 3.0

_ACCOUNT = Account._meta.db_table
_RESERVATION = Reservation._meta.db_table
_LEDGER = LedgerEntry._meta.db_table
_USAGE = UsageRecord._meta.db_table
_SPEND = KeySpend._meta.db_table
_LEDGER_INSERT = (
    f"INSERT INTO {_LEDGER} (account_id, kind, amount, available_delta, reserved_delta, available_after, "
    "reserved_after, reference, actor, note, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_USAGE_COLUMNS = (
    "account_id",
    "api_key_id",
    "reservation_id",
    "request_id",
    "endpoint",
    "model_id",
    "worker_id",
    "prompt_tokens",
    "completion_tokens",
    "cost",
    "reserved",
    "overrun",
    "uncharged",
    "latency_ms",
    "ttft_ms",
    "streamed",
    "status",
    "error_code",
    "created_at",
    "queue_wait_ms",
)
_USAGE_INSERT = (
    f"INSERT INTO {_USAGE} ({', '.join(_USAGE_COLUMNS)}) VALUES ({', '.join('?' * len(_USAGE_COLUMNS))}) RETURNING id"
)
_CLAIM_COLUMNS = "id, account_id, api_key_id, model_id, amount, input_price, output_price, request_id, created_at"

_connection: sqlite3.Connection | None = None
_connection_name: str = ""


def _db() -> sqlite3.Connection:
    """This process's writer connection to the database Django uses (the test database in tests)."""
    global _connection, _connection_name
    name = str(django_connection.settings_dict["NAME"])
    if _connection is None or _connection_name != name:
        if _connection is not None:
            _connection.close()
        conn = sqlite3.connect(name, isolation_level=None, check_same_thread=False, timeout=0)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={settings.SPEEDINFER_SQLITE_SYNCHRONOUS}")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.row_factory = sqlite3.Row
        _connection, _connection_name = conn, name
    return _connection


def _text(moment: datetime) -> str:
    """A datetime as Django stores it in SQLite (UTC, naive, `str()` of it: its adapt_datetimefield_value),
    so the ORM reads it back the same."""
    return str(moment.astimezone(UTC).replace(tzinfo=None))


def _uuid(value: UUID | str) -> str:
    return (value if isinstance(value, UUID) else UUID(str(value))).hex  # Django's char(32) form


def _transaction(work: Callable[[sqlite3.Connection], T]) -> T:
    db = _db()
    db.execute("BEGIN IMMEDIATE")
    try:
        result = work(db)
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return result


async def run(work: Callable[[sqlite3.Connection], T]) -> T:
    """Run `work` in one write transaction on the loop; a busy database is waited for with sleeps."""
    deadline = time.monotonic() + BUSY_WAIT_S
    pause = 0.001
    while True:
        try:
            return _transaction(work)
        except sqlite3.OperationalError as exc:
            busy = "locked" in str(exc) or "busy" in str(exc)
            if not busy or time.monotonic() > deadline:
                raise DatabaseUnavailable(f"sqlite: {exc}") from exc
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.02)


def _balances(db: sqlite3.Connection, account_id: int) -> tuple[int, int]:
    row = db.execute(f"SELECT available, reserved FROM {_ACCOUNT} WHERE id = ?", (account_id,)).fetchone()
    return int(row[0]), int(row[1])


def _ledger(
    db: sqlite3.Connection,
    *,
    account_id: int,
    kind: str,
    amount: int,
    available_delta: int,
    reserved_delta: int,
    reference: str,
    actor: str,
    note: str,
    now: str,
) -> None:
    available, reserved = _balances(db, account_id)
    db.execute(
        _LEDGER_INSERT,
        (account_id, kind, amount, available_delta, reserved_delta, available, reserved, reference, actor, note, now),
    )


class _OverBudget(Exception):
    """Rolls the reserve's transaction back: the key's monthly budget would be exceeded."""

    def __init__(self, available: int) -> None:
        super().__init__("key budget exceeded")
        self.available = available


async def reserve(reservation: Reservation, *, budget: int | None) -> ReserveResult:
    """Hold reservation.amount (within the key's monthly `budget`) and save the reservation, or say why not."""
    amount = reservation.amount
    created = _text(reservation.created_at)
    lease = _text(reservation.lease_until) if reservation.lease_until else None

    def work(db: sqlite3.Connection) -> ReserveResult:
        held = db.execute(
            f"UPDATE {_ACCOUNT} SET available = available - ?, reserved = reserved + ? WHERE id = ? AND available >= ?",
            (amount, amount, reservation.account_id, amount),
        ).rowcount
        if held != 1:
            available = _balances(db, reservation.account_id)[0]
            return ReserveResult(held=False, refusal="insufficient_credits", available=available)
        if reservation.api_key_id is not None:
            _key_spend_hold(db, reservation, budget)
        db.execute(
            f"INSERT INTO {_RESERVATION} (id, account_id, api_key_id, model_id, amount, input_price, output_price, "
            "status, request_id, created_at, closed_at, lease_until) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, 'held', ?, ?, NULL, ?)",
            (
                _uuid(reservation.id),
                reservation.account_id,
                reservation.api_key_id,
                reservation.model_id,
                amount,
                reservation.input_price,
                reservation.output_price,
                reservation.request_id,
                created,
                lease,
            ),
        )
        _ledger(
            db,
            account_id=reservation.account_id,
            kind=LedgerEntry.Kind.RESERVE,
            amount=amount,
            available_delta=-amount,
            reserved_delta=amount,
            reference=str(reservation.id),
            actor="gateway",
            note="",
            now=created,
        )
        return ReserveResult(held=True)

    try:
        return await run(work)
    except _OverBudget as refusal:
        return ReserveResult(held=False, refusal="key_budget_exceeded", available=refusal.available)


def _key_spend_hold(db: sqlite3.Connection, reservation: Reservation, budget: int | None) -> None:
    month = str(month_start(reservation.created_at))
    key = reservation.api_key_id
    db.execute(
        f"INSERT INTO {_SPEND} (api_key_id, month, spent, reserved) VALUES (?, ?, 0, 0) "
        "ON CONFLICT (api_key_id, month) DO NOTHING",
        (key, month),
    )
    sql = f"UPDATE {_SPEND} SET reserved = reserved + ? WHERE api_key_id = ? AND month = ?"
    params: tuple[Any, ...] = (reservation.amount, key, month)
    if budget is not None:
        sql += " AND spent + reserved + ? <= ?"
        params += (reservation.amount, budget)
    if db.execute(sql, params).rowcount != 1:
        raise _OverBudget(_balances(db, reservation.account_id)[0])


def _key_spend_close(db: sqlite3.Connection, claimed: sqlite3.Row, *, held: int, charged: int) -> None:
    if claimed["api_key_id"] is None:
        return
    month = str(month_start(_parse(claimed["created_at"])))
    db.execute(
        f"UPDATE {_SPEND} SET reserved = reserved - ?, spent = spent + ? WHERE api_key_id = ? AND month = ?",
        (held, charged, claimed["api_key_id"], month),
    )


def _parse(text: str) -> datetime:
    """A datetime Django stored in SQLite (UTC, naive text) back as an aware one."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def _usage(
    db: sqlite3.Connection, claimed: sqlite3.Row, usage: dict[str, Any], now: datetime, **charge: int
) -> UsageRecord:
    fields: dict[str, Any] = {
        "account_id": claimed["account_id"],
        "api_key_id": claimed["api_key_id"],
        "reservation_id": UUID(claimed["id"]),
        "request_id": claimed["request_id"],
        "model_id": claimed["model_id"],
        "reserved": claimed["amount"],
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "cost": 0,
        "overrun": 0,
        "uncharged": 0,
        **usage,
        **charge,
        "created_at": now,
    }
    values = [fields[c] for c in _USAGE_COLUMNS]
    values[_USAGE_COLUMNS.index("reservation_id")] = claimed["id"]
    values[_USAGE_COLUMNS.index("created_at")] = _text(now)
    values[_USAGE_COLUMNS.index("streamed")] = int(bool(fields["streamed"]))
    (row_id,) = db.execute(_USAGE_INSERT, values).fetchone()
    record = UsageRecord(id=row_id, **fields)
    record._state.adding = False
    record._state.db = django_connection.alias
    return record


def _claim(db: sqlite3.Connection, reservation_id: UUID | str, status: str, now: str) -> sqlite3.Row | None:
    return db.execute(
        f"UPDATE {_RESERVATION} SET status = ?, closed_at = ? WHERE id = ? AND status = 'held' "
        f"RETURNING {_CLAIM_COLUMNS}",
        (status, now, _uuid(reservation_id)),
    ).fetchone()


async def settle(
    *, reservation_id: UUID | str, prompt_tokens: int, completion_tokens: int, usage: dict[str, Any]
) -> UsageRecord | None:
    """ledger_orm.settle's transaction: charge the counts' cost, capped at what the account can pay."""
    moment = timezone.now()
    now = _text(moment)

    def work(db: sqlite3.Connection) -> UsageRecord | None:
        claimed = _claim(db, reservation_id, Reservation.Status.SETTLED, now)
        was_held = claimed is not None
        if claimed is None:  # expired meanwhile: its content must still be paid for (it keeps its closed_at)
            claimed = db.execute(
                f"UPDATE {_RESERVATION} SET status = 'settled' WHERE id = ? AND status = 'expired' "
                f"RETURNING {_CLAIM_COLUMNS}",
                (_uuid(reservation_id),),
            ).fetchone()
            if claimed is None:
                return None
        held = claimed["amount"] if was_held else 0
        cost = cost_of(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            input_price=claimed["input_price"],
            output_price=claimed["output_price"],
        )
        available = _balances(db, claimed["account_id"])[0]
        charged = min(cost, held + available)
        db.execute(
            f"UPDATE {_ACCOUNT} SET available = available + ?, reserved = reserved - ? WHERE id = ?",
            (held - charged, held, claimed["account_id"]),
        )
        _ledger(
            db,
            account_id=claimed["account_id"],
            kind=LedgerEntry.Kind.SETTLE,
            amount=charged,
            available_delta=held - charged,
            reserved_delta=-held,
            reference=str(UUID(claimed["id"])),
            actor="gateway",
            note=settle_note(was_held=was_held, uncharged=cost - charged),
            now=now,
        )
        _key_spend_close(db, claimed, held=held, charged=charged)
        return _usage(
            db,
            claimed,
            usage,
            moment,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost=charged,
            overrun=max(0, cost - claimed["amount"]),
            uncharged=cost - charged,
        )

    return await run(work)


async def release(*, reservation_id: UUID | str, note: str, usage: dict[str, Any] | None) -> UsageRecord | None:
    """ledger_orm.release's transaction: return the whole hold; with `usage`, a zero-cost usage row."""
    moment = timezone.now()
    now = _text(moment)

    def work(db: sqlite3.Connection) -> UsageRecord | None:
        claimed = _claim(db, reservation_id, Reservation.Status.RELEASED, now)
        if claimed is None:
            return None
        amount = claimed["amount"]
        db.execute(
            f"UPDATE {_ACCOUNT} SET available = available + ?, reserved = reserved - ? WHERE id = ?",
            (amount, amount, claimed["account_id"]),
        )
        _key_spend_close(db, claimed, held=amount, charged=0)
        _ledger(
            db,
            account_id=claimed["account_id"],
            kind=LedgerEntry.Kind.RELEASE,
            amount=amount,
            available_delta=amount,
            reserved_delta=-amount,
            reference=str(UUID(claimed["id"])),
            actor="gateway",
            note=note,
            now=now,
        )
        return None if usage is None else _usage(db, claimed, usage, moment)

    return await run(work)


async def renew(*, reservation_id: UUID | str, lease_until: datetime) -> bool:
    """Push a held reservation's lease forward; False once it is closed."""

    def work(db: sqlite3.Connection) -> bool:
        return (
            db.execute(
                f"UPDATE {_RESERVATION} SET lease_until = ? WHERE id = ? AND status = 'held'",
                (_text(lease_until), _uuid(reservation_id)),
            ).rowcount
            == 1
        )

    return await run(work)
