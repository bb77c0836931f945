"""Per-key monthly budgets: enforced in the reservation's own statement (PostgreSQL) or transaction (SQLite)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from billing.models import KeySpend, Reservation
from billing.selectors import key_budget_document, key_spend_this_month
from billing.services import (
    InsufficientCredits,
    KeyBudgetExceeded,
    credits_reserve,
    reservation_release,
    reservation_settle,
    reservations_expire,
)
from core.credits import MICRO
from tests.factories import make_account, make_key, make_model

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def test_budget_refuses_what_does_not_fit_and_counts_running_holds():
    account = make_account(credits=100)
    key = make_key(account=account, monthly_budget=5 * MICRO).api_key
    model = make_model()
    first = credits_reserve(account_id=account.pk, amount=3 * MICRO, model=model, api_key_id=key.pk, budget=5 * MICRO)
    # 3 held + 3 more > 5: refused although the account has 97 credits available; the message has the figures.
    with pytest.raises(KeyBudgetExceeded, match="needs 3.000000 credits reserved; 2.000000 left of the key's monthly"):
        credits_reserve(account_id=account.pk, amount=3 * MICRO, model=model, api_key_id=key.pk, budget=5 * MICRO)
    account.refresh_from_db()
    assert (account.available, account.reserved) == (97 * MICRO, 3 * MICRO)  # the refusal moved nothing
    # Settled at 1000 + 500*2 micro-credits: spent moves from the hold; the rest of the budget is free again.
    reservation_settle(reservation_id=first.pk, prompt_tokens=1000, completion_tokens=500)
    month = key_spend_this_month(api_key_ids=[key.pk])[key.pk]
    assert (month.spent, month.reserved) == (2000, 0)
    second = credits_reserve(account_id=account.pk, amount=4 * MICRO, model=model, api_key_id=key.pk, budget=5 * MICRO)
    reservation_release(reservation_id=second.pk)
    month = key_spend_this_month(api_key_ids=[key.pk])[key.pk]
    assert (month.spent, month.reserved) == (2000, 0)
    doc = key_budget_document(api_key_id=key.pk, monthly_budget=5 * MICRO)
    assert doc is not None and (doc["limit"], doc["spent"]) == ("5.000000", "0.002000")
    # Credits are checked too, and named as such.
    with pytest.raises(InsufficientCredits, match="needs 200.000000 credits reserved; 99.998000 available"):
        credits_reserve(account_id=account.pk, amount=200 * MICRO, model=model, api_key_id=key.pk, budget=None)


def test_expired_holds_leave_the_budget():
    account = make_account(credits=10)
    key = make_key(account=account).api_key
    held = credits_reserve(account_id=account.pk, amount=MICRO, model=make_model(), api_key_id=key.pk, budget=MICRO)
    past = held.created_at - timedelta(seconds=5)
    Reservation.objects.filter(pk=held.pk).update(created_at=past, lease_until=past)  # its process died
    assert KeySpend.objects.get(api_key=key).reserved == MICRO
    assert reservations_expire(older_than=timedelta(seconds=1)) == 1
    # The sweeper's release frees the key's budget as well as the account's credits; nothing was spent.
    spend = KeySpend.objects.get(api_key=key)
    assert (spend.reserved, spend.spent) == (0, 0)
    # A settle arriving after the expiry still charges (content is never free), and it counts as spent
    # without taking the already-returned hold out twice.
    record = reservation_settle(reservation_id=held.pk, prompt_tokens=1000, completion_tokens=500)
    assert record is not None and record.cost == 2000
    spend.refresh_from_db()
    assert (spend.reserved, spend.spent) == (0, 2000)


def test_resets_at_is_the_first_instant_of_next_month():
    account = make_account(credits=1)
    key = make_key(account=account).api_key
    doc = key_budget_document(api_key_id=key.pk, monthly_budget=MICRO)
    now = datetime.now(UTC)
    assert doc is not None and doc["spent"] == "0.000000"
    expected = datetime(now.year + (now.month == 12), now.month % 12 + 1, 1, tzinfo=UTC)
    assert doc["resets_at"] == expected.isoformat().replace("+00:00", "Z")
    assert key_budget_document(api_key_id=key.pk, monthly_budget=None) is None


@pytest.mark.django_db(transaction=True)
def test_concurrent_reservations_never_exceed_the_budget():
    # 40 threads race to hold 1 credit each on one key capped at 7 credits, with 100 credits available.
    account = make_account(credits=100)
    key = make_key(account=account, monthly_budget=7 * MICRO).api_key
    model = make_model()
    barrier = threading.Barrier(40)

    def reserve(i: int) -> str:
        try:
            barrier.wait()
            credits_reserve(
                account_id=account.pk,
                amount=MICRO,
                model=model,
                api_key_id=key.pk,
                budget=7 * MICRO,
                request_id=f"b{i}",
            )
            return "held"
        except KeyBudgetExceeded:
            return "budget"
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=40) as pool:
        results = list(pool.map(reserve, range(40)))
    assert results.count("held") == 7 and results.count("budget") == 33
    account.refresh_from_db()
    assert (account.available, account.reserved) == (93 * MICRO, 7 * MICRO)
    assert KeySpend.objects.get(api_key=key).reserved == 7 * MICRO
