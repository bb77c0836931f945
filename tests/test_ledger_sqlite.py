"""The SQLite ledger's event-loop path (billing.ledger.sqlite on the process's own connection): what it
writes reads back through the ORM, with the same results as its sync path (tests/test_credits.py).

These run in the Makefile's SQLite pass (the embedded default); on PostgreSQL the async calls go to
billing.ledger.postgresql, tested elsewhere. The connection is the process's own, so the tests commit.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from billing.models import KeySpend, LedgerEntry, Reservation, UsageRecord
from billing.selectors import ledger_totals
from billing.services import (
    InsufficientCredits,
    KeyBudgetExceeded,
    credits_reserve_async,
    reservation_release_async,
    reservation_renew_async,
    reservation_settle_async,
    reservations_expire,
)
from core.credits import MICRO
from core.outcome import RequestOutcome
from tests.factories import make_account, make_key, make_model

pytestmark = [
    pytest.mark.sqlite,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "sqlite", reason="the SQLite engine (the Makefile's SQLite pass)"),
]


def reconciled(account):
    account.refresh_from_db()
    totals = ledger_totals(account=account)
    assert (totals.available, totals.reserved) == (account.available, account.reserved)
    assert account.available >= 0 and account.reserved >= 0
    return account


def test_reserve_settle_release_move_the_money_and_read_back_through_the_orm():
    account = make_account(credits=10)
    model = make_model(input_price=1 * MICRO, output_price=2 * MICRO)
    key = make_key(account=account).api_key
    outcome = RequestOutcome(request_id="r1", endpoint="/v1/chat/completions", worker_id="w1", latency=0.05)

    async def scenario():
        held = await credits_reserve_async(
            account_id=account.pk, amount=5 * MICRO, model=model, api_key_id=key.pk, request_id="r1"
        )
        record = await reservation_settle_async(
            reservation_id=held.pk, prompt_tokens=1_000_000, completion_tokens=500_000, outcome=outcome
        )
        again = await reservation_settle_async(reservation_id=held.pk, prompt_tokens=1, completion_tokens=1)
        second = await credits_reserve_async(account_id=account.pk, amount=MICRO, model=model, api_key_id=key.pk)
        failed = await reservation_release_async(reservation_id=second.pk, error_code="upstream_error", outcome=outcome)
        return held, record, again, failed

    held, record, again, failed = asyncio.run(scenario())
    assert again is None  # idempotent
    assert (record.cost, record.prompt_tokens, record.worker_id, record.latency_ms) == (2 * MICRO, 1_000_000, "w1", 50)
    stored = UsageRecord.objects.get(pk=record.pk)  # what the engine wrote reads back through the ORM
    assert (stored.cost, stored.reserved, stored.request_id, stored.status) == (2 * MICRO, 5 * MICRO, "r1", "ok")
    assert stored.reservation_id == held.pk and stored.created_at <= timezone.now()
    assert Reservation.objects.get(pk=held.pk).status == Reservation.Status.SETTLED
    assert failed is not None and failed.status == UsageRecord.Status.FAILED and failed.cost == 0
    account = reconciled(account)
    assert (account.available, account.reserved) == (8 * MICRO, 0)
    kinds = list(LedgerEntry.objects.filter(account=account).order_by("id").values_list("kind", flat=True))
    assert kinds == ["grant", "reserve", "settle", "reserve", "release"]
    spend = KeySpend.objects.get(api_key=key)
    assert (spend.spent, spend.reserved) == (2 * MICRO, 0)


def test_an_overrun_is_capped_at_what_the_account_can_pay():
    account = make_account(credits=1)
    model = make_model(input_price=1 * MICRO, output_price=1 * MICRO)

    async def scenario():
        held = await credits_reserve_async(account_id=account.pk, amount=41, model=model)
        return await reservation_settle_async(
            reservation_id=held.pk, prompt_tokens=1_000_000, completion_tokens=1_000_000
        )

    record = asyncio.run(scenario())
    assert (record.cost, record.uncharged) == (MICRO, 2 * MICRO - MICRO)
    account = reconciled(account)
    assert account.available == 0


def test_refusals_change_nothing():
    account = make_account(credits=1)
    model = make_model(input_price=MICRO, output_price=MICRO)
    key = make_key(account=account).api_key
    budget = 100

    async def scenario():
        with pytest.raises(InsufficientCredits):
            await credits_reserve_async(account_id=account.pk, amount=2 * MICRO, model=model)
        with pytest.raises(KeyBudgetExceeded, match="needs 0.000101 credits reserved; 0.000100 left of the key's"):
            await credits_reserve_async(
                account_id=account.pk, amount=101, model=model, api_key_id=key.pk, budget=budget
            )
        return await credits_reserve_async(
            account_id=account.pk, amount=100, model=model, api_key_id=key.pk, budget=budget
        )

    asyncio.run(scenario())
    account = reconciled(account)
    assert (account.available, account.reserved) == (MICRO - 100, 100)
    assert KeySpend.objects.get(api_key=key).reserved == 100


def test_a_settle_after_the_sweeper_expired_the_hold_still_charges_and_a_lease_keeps_it():
    account = make_account(credits=1)
    model = make_model(input_price=MICRO, output_price=MICRO)

    async def reserve_two():
        first = await credits_reserve_async(account_id=account.pk, amount=300, model=model)
        second = await credits_reserve_async(account_id=account.pk, amount=300, model=model)
        return first, second

    first, second = asyncio.run(reserve_two())
    past = timezone.now() - timedelta(hours=1)
    Reservation.objects.filter(pk__in=[first.pk, second.pk]).update(created_at=past, lease_until=past)
    assert asyncio.run(reservation_renew_async(reservation_id=second.pk)) is True  # its request is still running
    assert reservations_expire(older_than=timedelta(minutes=1)) == 1
    assert Reservation.objects.get(pk=second.pk).status == Reservation.Status.HELD
    record = asyncio.run(reservation_settle_async(reservation_id=first.pk, prompt_tokens=250, completion_tokens=0))
    assert record is not None and record.cost == 250  # content is never free
    account = reconciled(account)
    assert (account.available, account.reserved) == (MICRO - 250 - 300, 300)


def test_one_turns_reservations_commit_together_and_a_refused_one_holds_nothing():
    """Concurrent requests of one event-loop turn share one commit (group commit), each in its own
    savepoint: a reservation refused among them changes nothing, the others all hold."""
    from billing.ledger import sqlite as engine

    account = make_account(credits=10)
    model = make_model(input_price=1 * MICRO, output_price=2 * MICRO)
    commits = []
    real_commit = engine._commit

    def counting(turn):
        commits.append(turn.works)
        real_commit(turn)

    async def scenario():
        engine._commit = counting
        try:
            amounts = [2 * MICRO] * 4 + [50 * MICRO] + [2 * MICRO]  # the fifth does not fit
            return await asyncio.gather(
                *(credits_reserve_async(account_id=account.pk, amount=a, model=model) for a in amounts),
                return_exceptions=True,
            )
        finally:
            engine._commit = real_commit

    results = asyncio.run(scenario())
    assert [isinstance(r, InsufficientCredits) for r in results] == [False] * 4 + [True, False]
    assert sum(commits) == 6 and len(commits) < 6  # six works, fewer commits
    account = reconciled(account)
    assert (account.available, account.reserved) == (0, 10 * MICRO)
    assert Reservation.objects.filter(account=account, status=Reservation.Status.HELD).count() == 5
