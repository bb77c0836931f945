"""The SQLite ledger: reserve, settle, release, renew and expire as a handful of plain statements in
one write transaction (SQLite takes one writer at a time). See billing.ledger for the interface.

The async methods are the gateway's: they run on the event loop, on one connection the process owns,
in `BEGIN IMMEDIATE`, each in its own savepoint of the loop turn's transaction (`run`: the works of one
turn commit together). The ORM on a thread cost ~10 ms a request (every statement released and
re-took the GIL against a busy loop, and the ORM's own work was most of the cost; README
Performance); here the loop is blocked for the few hundred microseconds a transaction takes.
Another process (the schedule's sweeper, a management command) may hold the write lock for a
moment: a busy database is retried with short sleeps on the loop, never by blocking it, for up to
BUSY_WAIT_S; past that the gateway answers 503 (core.outages.DatabaseUnavailable).

The sync methods (admin, commands, the sweeper, tests) run the same statements on Django's
connection in `transaction.atomic`, so they see the caller's transaction and its busy timeout.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar
from uuid import UUID

from django.conf import settings
from django.db import connection as django_connection
from django.db import transaction
from django.utils import timezone

from accounts.models import Account, ApiKey
from billing.ledger import ReserveResult, month_start, settle_note
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
_KEY = ApiKey._meta.db_table
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
    "cached_tokens",
    "reasoning_tokens",
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
_CLAIM_COLUMNS = (
    "id, account_id, api_key_id, model_id, amount, input_price, output_price, cached_input_price, request_id, "
    "created_at"
)

_connection: sqlite3.Connection | None = None
transactions_on_loop = 0  # committed by run(), for Ledger.loop_round_trips
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


class _Db(Protocol):
    """What a transaction's work needs: this process's sqlite3 connection, or Django's cursor."""

    def execute(self, sql: str, params: Any = ..., /) -> Any: ...


class _OnDjango:
    """Django's connection for the sync callers: its cursor, rows by column name (as sqlite3.Row)."""

    def __init__(self, cursor: Any) -> None:
        cursor.cursor.row_factory = sqlite3.Row
        self.cursor = cursor

    def execute(self, sql: str, params: Any = (), /) -> Any:
        # Django's placeholder is %s (its debug cursor formats the logged query with it); none of
        # these statements has a literal "?".
        self.cursor.execute(sql.replace("?", "%s"), params)
        return self.cursor


def _on_django(work: Callable[[_Db], T], *, atomic: bool = True) -> T:
    """Run `work` on Django's connection, in its own transaction unless it is a single statement."""
    if not atomic:
        with django_connection.cursor() as cursor:
            return work(_OnDjango(cursor))
    with transaction.atomic(durable=True), django_connection.cursor() as cursor:
        return work(_OnDjango(cursor))


class _Turn:
    """The write transaction of one event-loop turn: the works of the requests that ran in that turn, a
    savepoint each, committed together once the turn's ready callbacks have run (group commit). A commit
    writes every page the transaction touched to the WAL: two a request were a third of the embedded
    gateway's CPU at c32 (py-spy; docs/performance.md), and one commit for a turn's works costs the same
    as one for a single work."""

    __slots__ = ("loop", "done", "works")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.done: asyncio.Future[None] = loop.create_future()
        self.works = 0


_turn: _Turn | None = None


def _open_turn(loop: asyncio.AbstractEventLoop) -> _Turn | None:
    """This loop's open turn, or a new one (BEGIN IMMEDIATE, commit scheduled); None while another
    loop's turn holds the process's connection (tests run a gateway thread beside their own loops)."""
    global _turn
    turn = _turn
    if turn is not None and turn.loop.is_closed():
        _commit(turn)  # its loop ended before the turn's commit ran: the works in it were done
        turn = None
    if turn is not None:
        return turn if turn.loop is loop else None
    _db().execute("BEGIN IMMEDIATE")  # a busy database raises here, before anything is written
    turn = _turn = _Turn(loop)
    loop.call_soon(_commit, turn)
    return turn


def _commit(turn: _Turn) -> None:
    global _turn
    if _turn is not turn:
        return  # committed already
    _turn = None
    db = _db()
    failure: Exception | None = None
    try:
        db.execute("COMMIT")
    except sqlite3.Error as exc:
        if db.in_transaction:
            db.execute("ROLLBACK")
        failure = DatabaseUnavailable(f"sqlite: {exc}")
    if turn.done.done() or turn.loop.is_closed():
        return
    if failure is not None:
        turn.done.set_exception(failure)
    else:
        turn.done.set_result(None)


async def run(work: Callable[[_Db], T]) -> T:
    """Run `work` in this loop turn's write transaction (its own savepoint: a work that raises undoes
    only itself); returns once the turn committed. A busy database is waited for with sleeps."""
    global transactions_on_loop
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + BUSY_WAIT_S
    pause = 0.001
    while True:
        try:
            turn = _open_turn(loop)
        except sqlite3.OperationalError as exc:
            busy = "locked" in str(exc) or "busy" in str(exc)
            if not busy or time.monotonic() > deadline:
                raise DatabaseUnavailable(f"sqlite: {exc}") from exc
            turn = None
        if turn is not None:
            break
        if time.monotonic() > deadline:
            raise DatabaseUnavailable("sqlite: the process's connection stayed busy")
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.02)
    db = _db()
    turn.works += 1
    savepoint = f"work{turn.works}"
    db.execute(f"SAVEPOINT {savepoint}")
    try:
        result = work(db)
    except BaseException:
        db.execute(f"ROLLBACK TO {savepoint}")
        db.execute(f"RELEASE {savepoint}")
        raise
    db.execute(f"RELEASE {savepoint}")
    # Shielded: a caller cancelled meanwhile does not stop the commit its own work (and the others') is in.
    await asyncio.shield(turn.done)
    transactions_on_loop += 1
    return result


def _balances(db: _Db, account_id: int) -> tuple[int, int]:
    row = db.execute(f"SELECT available, reserved FROM {_ACCOUNT} WHERE id = ?", (account_id,)).fetchone()
    return int(row[0]), int(row[1])


def _ledger(
    db: _Db,
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

    def __init__(self, available: int, budget_left: int) -> None:
        super().__init__("key budget exceeded")
        self.available = available
        self.budget_left = budget_left


def _reserve(reservation: Reservation, budget: int | None) -> Callable[[_Db], ReserveResult]:
    amount = reservation.amount
    created = _text(reservation.created_at)
    lease = _text(reservation.lease_until) if reservation.lease_until else None

    def work(db: _Db) -> ReserveResult:
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
            "cached_input_price, status, request_id, created_at, closed_at, lease_until) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'held', ?, ?, NULL, ?)",
            (
                _uuid(reservation.id),
                reservation.account_id,
                reservation.api_key_id,
                reservation.model_id,
                amount,
                reservation.input_price,
                reservation.output_price,
                reservation.cached_input_price,
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

    return work


def _over_budget(refusal: _OverBudget) -> ReserveResult:
    return ReserveResult(
        held=False, refusal="key_budget_exceeded", available=refusal.available, budget_left=refusal.budget_left
    )


def _key_spend_hold(db: _Db, reservation: Reservation, budget: int | None) -> None:
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
        assert budget is not None  # the row exists: only the budget's condition can refuse
        spent, reserved = db.execute(
            f"SELECT spent, reserved FROM {_SPEND} WHERE api_key_id = ? AND month = ?", (key, month)
        ).fetchone()
        raise _OverBudget(_balances(db, reservation.account_id)[0], max(0, budget - spent - reserved))


def _key_spend_close(db: _Db, claimed: sqlite3.Row, *, held: int, charged: int) -> None:
    if claimed["api_key_id"] is None:
        return
    month = str(month_start(_parse(claimed["created_at"])))
    db.execute(
        f"UPDATE {_SPEND} SET reserved = reserved - ?, spent = spent + ? WHERE api_key_id = ? AND month = ?",
        (held, charged, claimed["api_key_id"], month),
    )


def _parse(stored: str | datetime) -> datetime:
    """A datetime Django stored in SQLite (UTC, naive text) back as an aware one. Django's connection
    converts a datetime column itself (naive UTC); this process's own connection returns the text."""
    return (stored if isinstance(stored, datetime) else datetime.fromisoformat(stored)).replace(tzinfo=UTC)


def _usage(db: _Db, claimed: sqlite3.Row, usage: dict[str, Any], now: datetime, **charge: int) -> UsageRecord:
    fields: dict[str, Any] = {
        "account_id": claimed["account_id"],
        "api_key_id": claimed["api_key_id"],
        "reservation_id": UUID(claimed["id"]),
        "request_id": claimed["request_id"],
        "model_id": claimed["model_id"],
        "reserved": claimed["amount"],
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "cached_tokens": 0,
        "reasoning_tokens": 0,
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


def _claim(
    db: _Db, reservation_id: UUID | str, status: str, now: str, *, lease_passed: bool = False
) -> sqlite3.Row | None:
    """Move a held reservation to `status`; None when another path closed it (or, with `lease_passed`,
    when its request renewed the lease meanwhile)."""
    lease = " AND (lease_until IS NULL OR lease_until < ?)" if lease_passed else ""
    return db.execute(
        f"UPDATE {_RESERVATION} SET status = ?, closed_at = ? WHERE id = ? AND status = 'held'{lease} "
        f"RETURNING {_CLAIM_COLUMNS}",
        (status, now, _uuid(reservation_id), *((now,) if lease_passed else ())),
    ).fetchone()


def _budget_left(db: _Db, claimed: sqlite3.Row, *, held: int) -> int | None:
    """What is left of the key's monthly budget beside its other running holds (None: no budget).
    The claim's UPDATE took the database's write lock, so no other settle moves these meanwhile."""
    if claimed["api_key_id"] is None:
        return None
    row = db.execute(
        f"SELECT k.monthly_budget, s.spent, s.reserved FROM {_KEY} k JOIN {_SPEND} s ON s.api_key_id = k.id "
        "WHERE k.id = ? AND s.month = ? AND k.monthly_budget IS NOT NULL",
        (claimed["api_key_id"], str(month_start(_parse(claimed["created_at"])))),
    ).fetchone()
    if row is None:
        return None
    budget, spent, reserved = int(row[0]), int(row[1]), int(row[2])
    return max(0, budget - spent - (reserved - held))


def _settle(
    reservation_id: UUID | str, prompt_tokens: int, completion_tokens: int, usage: dict[str, Any], cached_tokens: int
) -> Callable[[_Db], UsageRecord | None]:
    """Charge the counts' cost, capped at what the account can pay; a reservation the sweeper expired
    meanwhile is still charged (from available: its hold went back then)."""
    moment = timezone.now()
    now = _text(moment)

    def work(db: _Db) -> UsageRecord | None:
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
            cached_tokens=cached_tokens,
            cached_input_price=claimed["cached_input_price"],
        )
        # The claim's UPDATE took the database's write lock: this balance is the one changed below.
        available = _balances(db, claimed["account_id"])[0]
        charged = min(cost, held + available)
        budget_left = _budget_left(db, claimed, held=held)
        if budget_left is not None:
            charged = min(charged, budget_left)
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
            cached_tokens=cached_tokens,
            cost=charged,
            overrun=max(0, cost - claimed["amount"]),
            uncharged=cost - charged,
        )

    return work


def _return_hold(
    reservation_id: UUID | str,
    *,
    status: str,
    kind: str,
    actor: str,
    note: str,
    usage: dict[str, Any] | None = None,
    moment: datetime | None = None,
    lease_passed: bool = False,
) -> Callable[[_Db], tuple[bool, UsageRecord | None]]:
    """A release (or the sweeper's expiry): return the whole hold; with `usage`, a zero-cost usage row.
    The work's result says whether the reservation was claimed."""
    moment = moment or timezone.now()
    now = _text(moment)

    def work(db: _Db) -> tuple[bool, UsageRecord | None]:
        claimed = _claim(db, reservation_id, status, now, lease_passed=lease_passed)
        if claimed is None:
            return False, None
        amount = claimed["amount"]
        db.execute(
            f"UPDATE {_ACCOUNT} SET available = available + ?, reserved = reserved - ? WHERE id = ?",
            (amount, amount, claimed["account_id"]),
        )
        _key_spend_close(db, claimed, held=amount, charged=0)  # after the account: the lock order
        _ledger(
            db,
            account_id=claimed["account_id"],
            kind=kind,
            amount=amount,
            available_delta=amount,
            reserved_delta=-amount,
            reference=str(UUID(claimed["id"])),
            actor=actor,
            note=note,
            now=now,
        )
        return True, None if usage is None else _usage(db, claimed, usage, moment)

    return work


def _release(reservation_id: UUID | str, note: str, usage: dict[str, Any] | None) -> Callable[[_Db], Any]:
    return _return_hold(
        reservation_id,
        status=Reservation.Status.RELEASED,
        kind=LedgerEntry.Kind.RELEASE,
        actor="gateway",
        note=note,
        usage=usage,
    )


def _renew(reservation_id: UUID | str, lease_until: datetime) -> Callable[[_Db], bool]:
    def work(db: _Db) -> bool:
        return bool(
            db.execute(
                f"UPDATE {_RESERVATION} SET lease_until = ? WHERE id = ? AND status = 'held'",
                (_text(lease_until), _uuid(reservation_id)),
            ).rowcount
            == 1
        )

    return work


def _renew_many(reservation_ids: Sequence[UUID | str], lease_until: datetime) -> Callable[[_Db], None]:
    def work(db: _Db) -> None:
        ids = [_uuid(r) for r in reservation_ids]
        for at in range(0, len(ids), 500):  # well under SQLite's bound on parameters
            chunk = ids[at : at + 500]
            db.execute(
                f"UPDATE {_RESERVATION} SET lease_until = ? WHERE status = 'held'"
                f" AND id IN ({','.join('?' * len(chunk))})",
                (_text(lease_until), *chunk),
            )

    return work


class SQLiteLedger:
    """billing.ledger.Ledger on SQLite: the same statements on the process's own connection on the
    event loop (async) or on Django's connection (sync)."""

    vendor = "sqlite"

    def reserve(self, reservation: Reservation, *, budget: int | None) -> ReserveResult:
        try:
            return _on_django(_reserve(reservation, budget))
        except _OverBudget as refusal:
            return _over_budget(refusal)

    async def reserve_async(self, reservation: Reservation, *, budget: int | None) -> ReserveResult:
        try:
            return await run(_reserve(reservation, budget))
        except _OverBudget as refusal:
            return _over_budget(refusal)

    def settle(
        self,
        *,
        reservation_id: UUID | str,
        prompt_tokens: int,
        completion_tokens: int,
        usage: dict[str, Any],
        cached_tokens: int = 0,
    ) -> UsageRecord | None:
        return _on_django(_settle(reservation_id, prompt_tokens, completion_tokens, usage, cached_tokens))

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
        # One writer connection on the loop: statements never queue on a row lock, so no pacing.
        return await run(_settle(reservation_id, prompt_tokens, completion_tokens, usage, cached_tokens))

    def release(self, *, reservation_id: UUID | str, note: str, usage: dict[str, Any] | None) -> UsageRecord | None:
        return _on_django(_release(reservation_id, note, usage))[1]

    async def release_async(
        self, *, reservation_id: UUID | str, note: str, usage: dict[str, Any] | None, account_id: int | None = None
    ) -> UsageRecord | None:
        return (await run(_release(reservation_id, note, usage)))[1]

    def renew(self, *, reservation_id: UUID | str, lease_until: datetime) -> bool:
        return _on_django(_renew(reservation_id, lease_until), atomic=False)  # one UPDATE

    async def renew_async(self, *, reservation_id: UUID | str, lease_until: datetime) -> bool:
        return await run(_renew(reservation_id, lease_until))

    async def renew_many_async(self, *, reservation_ids: Sequence[UUID | str], lease_until: datetime) -> None:
        await run(_renew_many(reservation_ids, lease_until))

    def expire(self, *, reservation_id: UUID | str, note: str, now: datetime) -> bool:
        work = _return_hold(
            reservation_id,
            status=Reservation.Status.EXPIRED,
            kind=LedgerEntry.Kind.EXPIRE,
            actor="sweeper",
            note=note,
            moment=now,
            lease_passed=True,
        )
        return _on_django(work)[0]

    def loop_round_trips(self) -> int:
        return transactions_on_loop
