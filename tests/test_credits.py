from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from billing.models import LedgerEntry, Reservation, UsageRecord
from billing.pricing import cost_of
from billing.selectors import ledger_totals
from billing.services import (
    InsufficientCredits,
    InvalidAmount,
    credits_grant,
    credits_reserve,
    reservation_release,
    reservation_renew,
    reservation_settle,
    reservations_expire,
)
from core.credits import MICRO, AmountError, format_credits, parse_credits
from core.outcome import RequestOutcome
from tests.factories import make_account, make_model

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def assert_ledger_balances(account):
    account.refresh_from_db()
    totals = ledger_totals(account=account)
    assert (totals.available, totals.reserved) == (account.available, account.reserved)
    assert account.available >= 0 and account.reserved >= 0


def test_prices_parse_exactly_and_costs_round_up():
    assert parse_credits("1.5") == 1_500_000
    assert parse_credits("0.000001") == 1
    with pytest.raises(AmountError, match="6 decimal"):
        parse_credits("0.0000001")
    with pytest.raises(AmountError, match="negative"):
        parse_credits("-1")
    with pytest.raises(AmountError):
        parse_credits("ten")
    assert format_credits(1_500_000) == "1.500000"
    # 3 tokens at 1 credit per 1M tokens = 3 micro-credits; 1 token at 0.5 credits/1M rounds up to 1.
    assert cost_of(prompt_tokens=3, completion_tokens=0, input_price=MICRO, output_price=0) == 3
    assert cost_of(prompt_tokens=1, completion_tokens=0, input_price=MICRO // 2, output_price=0) == 1


def test_reserve_then_settle_charges_the_actual_cost_and_returns_the_rest():
    account = make_account(credits=10)
    model = make_model(input_price=1 * MICRO, output_price=2 * MICRO)
    reservation = credits_reserve(account_id=account.pk, amount=5 * MICRO, model=model, request_id="r1")
    account.refresh_from_db()
    assert (account.available, account.reserved) == (5 * MICRO, 5 * MICRO)

    record = reservation_settle(
        reservation_id=reservation.pk,
        prompt_tokens=1000,
        completion_tokens=500,
        outcome=RequestOutcome(request_id="", worker_id="w1", latency=0.0),
    )
    assert record is not None and record.cost == 2000  # 1000*1 + 500*2 micro-credits
    account.refresh_from_db()
    assert (account.available, account.reserved) == (10 * MICRO - 2000, 0)
    assert_ledger_balances(account)


def test_settling_twice_charges_once():
    account = make_account(credits=10)
    reservation = credits_reserve(account_id=account.pk, amount=MICRO, model=make_model())
    first = reservation_settle(
        reservation_id=reservation.pk,
        prompt_tokens=10,
        completion_tokens=10,
        outcome=RequestOutcome(request_id="", latency=0.0),
    )
    second = reservation_settle(
        reservation_id=reservation.pk,
        prompt_tokens=10,
        completion_tokens=10,
        outcome=RequestOutcome(request_id="", latency=0.0),
    )
    assert first is not None and second is None
    assert UsageRecord.objects.filter(account=account).count() == 1
    assert_ledger_balances(account)


def test_release_charges_nothing_and_is_idempotent():
    account = make_account(credits=3)
    reservation = credits_reserve(account_id=account.pk, amount=2 * MICRO, model=make_model())
    record = reservation_release(reservation_id=reservation.pk, error_code="upstream_error")
    assert record is not None and record.cost == 0 and record.status == "failed"
    assert reservation_release(reservation_id=reservation.pk, error_code="upstream_error") is None
    # A late settle after a release must not charge.
    assert (
        reservation_settle(
            reservation_id=reservation.pk,
            prompt_tokens=5,
            completion_tokens=5,
            outcome=RequestOutcome(request_id="", latency=0.0),
        )
        is None
    )
    account.refresh_from_db()
    assert (account.available, account.reserved) == (3 * MICRO, 0)
    assert_ledger_balances(account)


def test_reserve_refuses_what_does_not_fit():
    account = make_account(credits=1)
    with pytest.raises(InsufficientCredits):
        credits_reserve(account_id=account.pk, amount=MICRO + 1, model=make_model())
    account.refresh_from_db()
    assert (account.available, account.reserved) == (MICRO, 0)
    assert not Reservation.objects.exists()


def test_an_overrun_is_charged_and_recorded():
    account = make_account(credits=10)
    reservation = credits_reserve(account_id=account.pk, amount=100, model=make_model())
    record = reservation_settle(
        reservation_id=reservation.pk,
        prompt_tokens=100,
        completion_tokens=0,
        outcome=RequestOutcome(request_id="", latency=0.0),
    )
    assert record is not None and record.cost == 100
    reservation = credits_reserve(account_id=account.pk, amount=100, model=make_model())
    record = reservation_settle(
        reservation_id=reservation.pk,
        prompt_tokens=150,
        completion_tokens=0,
        outcome=RequestOutcome(request_id="", latency=0.0),
    )
    assert record is not None and (record.cost, record.overrun) == (150, 50)
    assert_ledger_balances(account)


def test_an_overrun_beyond_the_balance_is_capped_never_overdrawn_and_recorded():
    """The issue's figures: 1,000,000 + 1,000,000 tokens reported against a 41 micro-credit hold."""
    account = make_account(credits=0)
    credits_grant(account=account, amount=41, actor="staff")
    model = make_model(input_price=1 * MICRO, output_price=2 * MICRO)
    reservation = credits_reserve(account_id=account.pk, amount=41, model=model)
    record = reservation_settle(
        reservation_id=reservation.pk,
        prompt_tokens=1_000_000,
        completion_tokens=1_000_000,
        outcome=RequestOutcome(request_id="", latency=0.0, worker_id="greedy-1"),
    )
    assert record is not None
    full_cost = 3 * MICRO
    assert (record.cost, record.reserved, record.overrun, record.uncharged) == (41, 41, full_cost - 41, full_cost - 41)
    assert record.worker_id == "greedy-1"
    account.refresh_from_db()
    assert (account.available, account.reserved) == (0, 0)
    settle_row = LedgerEntry.objects.get(account=account, kind="settle")
    assert settle_row.amount == 41 and f"uncharged overrun {full_cost - 41} micro-credits" in settle_row.note
    assert_ledger_balances(account)
    # Usage rows and ledger agree on what was charged.
    assert sum(UsageRecord.objects.filter(account=account).values_list("cost", flat=True)) == settle_row.amount


def test_an_overrun_the_balance_covers_is_charged_in_full():
    account = make_account(credits=1)
    reservation = credits_reserve(account_id=account.pk, amount=100, model=make_model())
    record = reservation_settle(reservation_id=reservation.pk, prompt_tokens=300, completion_tokens=0)
    assert record is not None and (record.cost, record.overrun, record.uncharged) == (300, 200, 0)
    account.refresh_from_db()
    assert account.available == MICRO - 300
    assert LedgerEntry.objects.get(account=account, kind="settle").note == ""
    assert_ledger_balances(account)


def test_the_database_refuses_a_negative_balance():
    from django.db import IntegrityError, transaction

    from accounts.models import Account

    account = make_account(credits=1)
    with pytest.raises(IntegrityError), transaction.atomic():
        Account.objects.filter(pk=account.pk).update(available=-1)
    with pytest.raises(IntegrityError), transaction.atomic():
        Account.objects.filter(pk=account.pk).update(reserved=-1)


@pytest.mark.parametrize("count", [2**31, 2**63, -1, 1_000_000_001, 1.0, True])
def test_token_counts_outside_the_sane_range_are_refused_and_the_hold_can_still_be_released(count):
    account = make_account(credits=1)
    reservation = credits_reserve(account_id=account.pk, amount=100, model=make_model())
    with pytest.raises(InvalidAmount):
        reservation_settle(reservation_id=reservation.pk, prompt_tokens=count, completion_tokens=0)
    assert Reservation.objects.get(pk=reservation.pk).status == "held"
    reservation_release(reservation_id=reservation.pk, error_code="runtime_usage_unavailable")
    account.refresh_from_db()
    assert (account.available, account.reserved) == (MICRO, 0)
    assert_ledger_balances(account)


def test_a_leased_reservation_is_never_swept_and_renewing_keeps_it():
    account = make_account(credits=1)
    reservation = credits_reserve(account_id=account.pk, amount=100, model=make_model())
    Reservation.objects.filter(pk=reservation.pk).update(created_at=timezone.now() - timedelta(hours=1))
    assert reservations_expire(older_than=timedelta(seconds=3)) == 0  # old, but its request still runs
    Reservation.objects.filter(pk=reservation.pk).update(lease_until=timezone.now() - timedelta(seconds=1))
    assert reservation_renew(reservation_id=reservation.pk)  # the gateway renews it in time
    assert reservations_expire(older_than=timedelta(seconds=3)) == 0
    assert Reservation.objects.get(pk=reservation.pk).status == "held"


def test_a_settle_after_the_sweeper_expired_the_hold_still_charges():
    account = make_account(credits=0)
    credits_grant(account=account, amount=250, actor="staff")
    reservation = credits_reserve(account_id=account.pk, amount=100, model=make_model())
    past = timezone.now() - timedelta(hours=1)
    Reservation.objects.filter(pk=reservation.pk).update(created_at=past, lease_until=past)
    assert reservations_expire(older_than=timedelta(seconds=3)) == 1
    assert not reservation_renew(reservation_id=reservation.pk)
    # 300 micro-credits of content were delivered; the account has 250: charged 250, 50 uncharged.
    record = reservation_settle(reservation_id=reservation.pk, prompt_tokens=300, completion_tokens=0)
    assert record is not None and (record.cost, record.uncharged) == (250, 50)
    assert Reservation.objects.get(pk=reservation.pk).status == "settled"
    account.refresh_from_db()
    assert (account.available, account.reserved) == (0, 0)
    settle_row = LedgerEntry.objects.get(account=account, kind="settle")
    assert (settle_row.amount, settle_row.reserved_delta) == (250, 0)
    assert "settled after the reservation expired" in settle_row.note
    assert reservation_settle(reservation_id=reservation.pk, prompt_tokens=300, completion_tokens=0) is None
    assert_ledger_balances(account)


def test_the_sweeper_releases_only_stale_reservations():
    account = make_account(credits=10)
    model = make_model()
    stale = credits_reserve(account_id=account.pk, amount=MICRO, model=model)
    fresh = credits_reserve(account_id=account.pk, amount=MICRO, model=model)
    # Its process died an hour ago: it stopped renewing the lease too.
    an_hour_ago = timezone.now() - timedelta(hours=1)
    Reservation.objects.filter(pk=stale.pk).update(created_at=an_hour_ago, lease_until=an_hour_ago)
    assert reservations_expire(older_than=timedelta(minutes=15)) == 1
    assert reservations_expire(older_than=timedelta(minutes=15)) == 0
    assert Reservation.objects.get(pk=stale.pk).status == "expired"
    assert Reservation.objects.get(pk=fresh.pk).status == "held"
    account.refresh_from_db()
    assert (account.available, account.reserved) == (9 * MICRO, MICRO)
    assert_ledger_balances(account)


def test_a_negative_grant_cannot_overdraw():
    account = make_account(credits=2)
    with pytest.raises(InsufficientCredits):
        credits_grant(account=account, amount=-3 * MICRO, actor="staff")
    credits_grant(account=account, amount=-2 * MICRO, actor="staff", note="refund reversal")
    account.refresh_from_db()
    assert account.available == 0
    assert LedgerEntry.objects.filter(account=account, kind="grant").count() == 2


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_concurrent_reservations_never_overdraw_and_the_ledger_balances(monkeypatch):
    """40 threads race to reserve 1 credit each against 10 credits; then mixed closes race too.

    A read-then-write reservation would let several threads see the same balance
    and overdraw; the conditional UPDATE lets exactly 10 through.
    """
    import billing.services

    monkeypatch.setattr(billing.services, "LEASE", timedelta(0))  # leases lapse at once, so the sweep races too
    account = make_account(credits=10)
    model = make_model()
    barrier = threading.Barrier(40)

    def reserve(i: int) -> str | None:
        try:
            barrier.wait()
            return str(credits_reserve(account_id=account.pk, amount=MICRO, model=model, request_id=f"c{i}").pk)
        except InsufficientCredits:
            return None
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=40) as pool:
        results = list(pool.map(reserve, range(40)))
    held = [r for r in results if r]
    assert len(held) == 10
    account.refresh_from_db()
    assert (account.available, account.reserved) == (0, 10 * MICRO)

    # Close every reservation from two racing paths at once (settle vs release vs expire).
    rng = random.Random(7)

    def close(reservation_id: str) -> None:
        try:
            action = rng.choice(["settle", "release", "expire"])
            if action == "settle":
                reservation_settle(
                    reservation_id=reservation_id,
                    prompt_tokens=100,
                    completion_tokens=50,
                    outcome=RequestOutcome(request_id="", latency=0.0),
                )
            elif action == "release":
                reservation_release(reservation_id=reservation_id, error_code="upstream_error")
            else:
                reservations_expire(older_than=timedelta(seconds=-60))
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=20) as pool:
        list(pool.map(close, held + held))
    assert not Reservation.objects.filter(status="held").exists()
    account.refresh_from_db()
    assert account.reserved == 0
    settled = UsageRecord.objects.filter(account=account, status="ok").count()
    assert account.available == 10 * MICRO - settled * 200
    assert_ledger_balances(account)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_concurrent_overrunning_settles_never_overdraw():
    """20 holds of 0.1 credit on a 2-credit account, all settled at once with 1M tokens each (1 credit):
    together they charge exactly the 2 credits there were, never more, and every row reconciles."""
    account = make_account(credits=2)
    model = make_model(input_price=MICRO, output_price=0)
    held = [str(credits_reserve(account_id=account.pk, amount=MICRO // 10, model=model).pk) for _ in range(20)]
    barrier = threading.Barrier(20)

    def settle(reservation_id: str) -> None:
        try:
            barrier.wait()
            reservation_settle(reservation_id=reservation_id, prompt_tokens=1_000_000, completion_tokens=0)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=20) as pool:
        list(pool.map(settle, held))
    account.refresh_from_db()
    assert (account.available, account.reserved) == (0, 0)
    records = UsageRecord.objects.filter(account=account)
    assert sum(r.cost for r in records) == 2 * MICRO
    assert sum(r.cost + r.uncharged for r in records) == 20 * MICRO
    assert_ledger_balances(account)
