"""One account's money statements reach PostgreSQL SPEEDINFER_DB_ACCOUNT_CONCURRENCY at a time per process
(billing.ledger.postgresql._account_turn); the rest wait in the process, and every one of them still holds
and settles exactly."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from django.db import connection

from billing.models import UsageRecord
from billing.services import credits_reserve_async, reservation_settle_async
from catalog.models import PublicModel
from core import pgpool, state
from tests.factories import make_account, make_model, money

pytestmark = [pytest.mark.django_db(transaction=True)]

REQUESTS = 24


def _busiest(account_id: int, model: PublicModel) -> tuple[int, list[UsageRecord | None]]:
    """REQUESTS reservations and their settles at once for one account, through the gateway's pool; the
    most gateway statements PostgreSQL was running (or holding on a lock) at any one sample."""

    async def main() -> tuple[int, list[UsageRecord | None]]:
        busiest = 0
        done, ready = asyncio.Event(), asyncio.Event()
        pool = await pgpool.get_pool()
        await pool.open(wait=True)
        await pool.resize(min_size=8)  # every connection open (and configured) before the burst
        await pool.wait()

        async def sample() -> None:
            nonlocal busiest
            async with await psycopg.AsyncConnection.connect(pgpool.conninfo(), autocommit=True) as conn:
                ready.set()
                while not done.is_set():
                    cursor = await conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'speedinfer-gateway' "
                        "AND state = 'active' AND query ~ '^\\s*WITH'"  # a money statement, not a new connection's SET
                    )
                    row = await cursor.fetchone()
                    busiest = max(busiest, row[0] if row else 0)
                    await asyncio.sleep(0)

        sampler = asyncio.create_task(sample())
        await ready.wait()
        held = await asyncio.gather(
            *(
                credits_reserve_async(account_id=account_id, amount=1000, model=model, request_id=f"r{i}")
                for i in range(REQUESTS)
            )
        )
        records = await asyncio.gather(
            *(
                reservation_settle_async(
                    reservation_id=r.pk, prompt_tokens=100, completion_tokens=100, account_id=account_id
                )
                for r in held
            )
        )
        done.set()
        await sampler
        await pool.close()
        return busiest, list(records)

    return asyncio.run(main())


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's row lock; SQLite has one writer")
def test_one_accounts_statements_reach_postgresql_two_at_a_time_and_all_settle_exactly(settings):
    model = make_model(model_id="acme/paced", input_price=1_000_000, output_price=1_000_000)
    account = make_account(credits=1)  # 1 credit: 1,000,000 micro-credits

    settings.SPEEDINFER_DB_ACCOUNT_CONCURRENCY = 2
    state.reset()
    busiest, records = _busiest(account.pk, model)
    assert busiest <= 2
    assert all(r is not None and r.cost == 200 for r in records)
    assert money(account) == (1_000_000 - REQUESTS * 200, 0)

    # Without the limit the pool's connections all queue on the account's row lock: the limit is what
    # kept it at two.
    settings.SPEEDINFER_DB_ACCOUNT_CONCURRENCY = 0
    settings.SPEEDINFER_DB_POOL_SIZE = 8
    state.reset()
    busiest, records = _busiest(account.pk, model)
    assert busiest > 2
    assert money(account) == (1_000_000 - 2 * REQUESTS * 200, 0)
    state.reset()
