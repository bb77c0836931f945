"""PostgreSQL statements for the gateway's money path: one round trip each.

Reserve, settle and release each run as ONE statement whose data-modifying CTEs
do what the ORM path in billing.services does in five or six queries: the
conditional account UPDATE (row-locked until the statement commits), the
reservation claim with its row-count check, and the append-only ledger and
usage rows with the balances the UPDATE returned. A single statement is its own
transaction, so the invariants are the same as the ORM path's; only the number
of round trips (and Python-side ORM work) changes. Tests run both paths.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import connection

from accounts.models import Account
from billing.models import LedgerEntry, Reservation, UsageRecord

_ACCOUNT = Account._meta.db_table
_RESERVATION = Reservation._meta.db_table
_LEDGER = LedgerEntry._meta.db_table
_USAGE = UsageRecord._meta.db_table

_LEDGER_COLUMNS = (
    "account_id, kind, amount, available_delta, reserved_delta, available_after, reserved_after, "
    "reference, actor, note, created_at"
)

RESERVE = f"""
WITH acc AS (
    UPDATE {_ACCOUNT} SET available = available - %(amount)s::bigint, reserved = reserved + %(amount)s::bigint
    WHERE id = %(account_id)s::bigint AND available >= %(amount)s::bigint
    RETURNING id, available, reserved
), res AS (
    INSERT INTO {_RESERVATION}
        (id, account_id, api_key_id, model_id, amount, input_price, output_price, status, request_id, created_at)
    SELECT %(id)s::uuid, id, %(api_key_id)s::bigint, %(model_id)s::varchar, %(amount)s::bigint,
        %(input_price)s::bigint, %(output_price)s::bigint, 'held', %(request_id)s::varchar, %(now)s::timestamptz
    FROM acc
    RETURNING id
), led AS (
    INSERT INTO {_LEDGER} ({_LEDGER_COLUMNS})
    SELECT id, 'reserve', %(amount)s::bigint, -(%(amount)s::bigint), %(amount)s::bigint, available, reserved,
        %(reference)s::varchar, 'gateway', '', %(now)s::timestamptz
    FROM acc
)
SELECT count(*) FROM res
"""

# The cost is computed in numeric so tokens x price cannot overflow bigint; it
# rounds up to the next micro-credit exactly as billing.pricing.cost_of does.
_CLAIM_AND_COST = f"""
WITH res AS (
    UPDATE {_RESERVATION} SET status = %(status)s::varchar, closed_at = %(now)s::timestamptz
    WHERE id = %(id)s::uuid AND status = 'held'
    RETURNING id, account_id, api_key_id, model_id, amount, request_id, input_price, output_price
), c AS (
    SELECT res.*, CEIL(
        (%(prompt_tokens)s::numeric * input_price + %(completion_tokens)s::numeric * output_price) / 1000000
    )::bigint AS cost
    FROM res
), acc AS (
    UPDATE {_ACCOUNT} a SET available = a.available + c.amount - c.cost, reserved = a.reserved - c.amount
    FROM c WHERE a.id = c.account_id
    RETURNING a.id, a.available, a.reserved
), led AS (
    INSERT INTO {_LEDGER} ({_LEDGER_COLUMNS})
    SELECT acc.id, %(kind)s::varchar, CASE WHEN %(kind)s::varchar = 'settle' THEN c.cost ELSE c.amount END,
        c.amount - c.cost, -c.amount, acc.available, acc.reserved, %(reference)s::varchar, 'gateway', %(note)s::text,
        %(now)s::timestamptz
    FROM acc, c
)
"""

_USAGE_RETURNING = (
    "id, account_id, api_key_id, reservation_id, request_id, endpoint, model_id, worker_id, prompt_tokens, "
    "completion_tokens, cost, reserved, overrun, latency_ms, ttft_ms, streamed, status, error_code, created_at"
)

CLOSE_WITH_USAGE = (
    _CLAIM_AND_COST
    + f""", usage AS (
    INSERT INTO {_USAGE}
        (account_id, api_key_id, reservation_id, request_id, endpoint, model_id, worker_id, prompt_tokens,
         completion_tokens, cost, reserved, overrun, latency_ms, ttft_ms, streamed, status, error_code, created_at)
    SELECT c.account_id, c.api_key_id, c.id, c.request_id, %(endpoint)s::varchar, c.model_id, %(worker_id)s::varchar,
        %(prompt_tokens)s::integer, %(completion_tokens)s::integer, c.cost, c.amount, GREATEST(0, c.cost - c.amount),
        %(latency_ms)s::integer, %(ttft_ms)s::integer, %(streamed)s::boolean, %(usage_status)s::varchar,
        %(error_code)s::varchar, %(now)s::timestamptz
    FROM c
    RETURNING {_USAGE_RETURNING}
)
SELECT * FROM usage
"""
)

CLOSE_WITHOUT_USAGE = _CLAIM_AND_COST + "SELECT count(*) FROM c"


def reserve(
    *,
    reservation_id: UUID,
    account_id: int,
    api_key_id: int | None,
    model_id: str,
    amount: int,
    input_price: int,
    output_price: int,
    request_id: str,
    now: datetime,
) -> bool:
    """True when the credits were held, False when they did not fit."""
    with connection.cursor() as cursor:
        cursor.execute(
            RESERVE,
            {
                "id": reservation_id,
                "account_id": account_id,
                "api_key_id": api_key_id,
                "model_id": model_id,
                "amount": amount,
                "input_price": input_price,
                "output_price": output_price,
                "request_id": request_id,
                "reference": str(reservation_id),
                "now": now,
            },
        )
        row = cursor.fetchone()
    return bool(row and row[0] == 1)


def close(
    *,
    reservation_id: UUID | str,
    status: str,
    kind: str,
    prompt_tokens: int,
    completion_tokens: int,
    now: datetime,
    note: str = "",
    usage: dict[str, Any] | None = None,
) -> UsageRecord | bool:
    """Claim a held reservation as `status` and move the money in one statement.

    A release is a settle at zero tokens (cost 0, the whole hold returned) with
    the ledger kind 'release'. With `usage`, also appends the usage record and
    returns it; without, returns whether the reservation was claimed.
    """
    params: dict[str, Any] = {
        "id": reservation_id,
        "status": status,
        "kind": kind,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "reference": str(reservation_id),
        "note": note,
        "now": now,
    }
    with connection.cursor() as cursor:
        if usage is None:
            cursor.execute(CLOSE_WITHOUT_USAGE, params)
            row = cursor.fetchone()
            return bool(row and row[0] == 1)
        cursor.execute(CLOSE_WITH_USAGE, {**params, **usage})
        row = cursor.fetchone()
        if row is None:
            return False
        names = [col.name for col in cursor.description]
    fields = dict(zip(names, row, strict=True))
    record = UsageRecord(**fields)
    record._state.adding = False
    record._state.db = connection.alias
    return record
