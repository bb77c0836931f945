"""What a new staff member meets on a first day in /admin/ (issue 13's staff list)."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from accounts.models import Account, ApiKey
from billing.models import Reservation
from billing.services import credits_reserve, reservation_settle
from core.credits import MICRO
from core.models import AuditLog
from tests.factories import make_account, make_key, make_model
from workers.models import Worker

pytestmark = pytest.mark.django_db


def registration(worker_id: str = "down-03") -> str:
    return json.dumps(
        {
            "worker_id": worker_id,
            "runtime": "cuda",
            "runtime_endpoint": "http://127.0.0.1:9/v1",
            "supported_models": ["acme/m1"],
            "runtime_config": {"transport": "openai"},
        }
    )


def test_branding_example_json_and_view_site(admin_client):
    index = admin_client.get("/admin/").content.decode()
    assert "SpeedInfer administration" in index and 'href="/"' in index
    assert 'href="/docs/"' in index and 'href="/api/docs/"' in index  # the API reference, from every page
    add = admin_client.get("/admin/workers/worker/add/").content.decode()
    assert "text_generation" in add and "runtime_endpoint" in add  # the example registration JSON


def test_add_worker_twice_says_updated_and_delete_is_audited(admin_client):
    make_model(model_id="acme/m1")
    first = admin_client.post("/admin/workers/worker/add/", {"registration": registration()}, follow=True)
    assert "was added successfully" in first.content.decode()
    again = admin_client.post("/admin/workers/worker/add/", {"registration": registration()}, follow=True)
    html = again.content.decode()
    assert "“down-03” was updated" in html and "added" not in html.split("messagelist")[1][:300]
    worker = Worker.objects.get(worker_id="down-03")
    # Probe now, from the worker's own page (the endpoint refuses: an error, shown with the worker).
    page = admin_client.get(f"/admin/workers/worker/{worker.pk}/change/").content.decode()
    assert f"/admin/workers/worker/{worker.pk}/probe/" in page and "Probe now" in page
    probed = admin_client.post(f"/admin/workers/worker/{worker.pk}/probe/", follow=True).content.decode()
    assert "Worker down-03: unhealthy" in probed and "Down-03" not in probed  # ids keep their case
    worker.refresh_from_db()
    assert worker.last_probe_error
    assert worker.last_probe_error[:40] in admin_client.get("/admin/workers/worker/").content.decode()
    admin_client.post(f"/admin/workers/worker/{worker.pk}/delete/", {"post": "yes"})
    assert not Worker.objects.filter(worker_id="down-03").exists()
    assert AuditLog.objects.filter(action="worker.delete", actor="admin").exists()


def test_grant_error_speaks_credits_and_keeps_the_form(admin_client):
    account = make_account(name="Acme", credits=1)
    url = f"/admin/accounts/account/{account.pk}/grant/"
    page = admin_client.post(url, {"amount": "-5", "note": "refund the test"})
    html = page.content.decode()
    assert page.status_code == 200
    assert "has 1.000000 credits available, less than the 5.000000 to remove" in html
    assert "micro" not in html and "refund the test" in html  # the form keeps what was typed


def test_audit_detail_is_readable_and_reservations_newest_first(admin_client):
    account = make_account(name="Acme", credits=10)
    admin_client.post(f"/admin/accounts/account/{account.pk}/grant/", {"amount": "2", "note": "a long note " * 10})
    listing = admin_client.get("/admin/core/auditlog/").content.decode()
    assert "note:</span> a long note" in listing and '{"amount"' not in listing
    model = make_model()
    old = credits_reserve(account_id=account.pk, amount=MICRO, model=model, request_id="old")
    new = credits_reserve(account_id=account.pk, amount=MICRO, model=model, request_id="new")
    assert old.pk != new.pk
    rows = admin_client.get("/admin/billing/reservation/").content.decode()
    assert rows.index(">new<") < rows.index(">old<")
    assert Reservation.objects.count() == 2


def test_keys_filter_by_state_show_budget_and_spend(admin_client):
    from datetime import timedelta

    from django.utils import timezone

    account = make_account(name="Acme", credits=10)
    active = make_key(account=account, name="active-key", monthly_budget=5 * MICRO).api_key
    make_key(account=account, name="old-key", expires_at=timezone.now() + timedelta(seconds=1))
    ApiKey.objects.filter(name="old-key").update(expires_at=timezone.now() - timedelta(days=1))
    revoked = make_key(account=account, name="gone-key").api_key
    ApiKey.objects.filter(pk=revoked.pk).update(revoked_at=timezone.now())
    held = credits_reserve(
        account_id=account.pk, amount=MICRO, model=make_model(), api_key_id=active.pk, budget=5 * MICRO
    )
    reservation_settle(reservation_id=held.pk, prompt_tokens=100, completion_tokens=1)  # 0.000102 at 1 and 2 per 1M
    for state, name in (("active", "active-key"), ("expired", "old-key"), ("revoked", "gone-key")):
        html = admin_client.get(f"/admin/accounts/apikey/?state={state}").content.decode()
        assert name in html and all(other not in html for other in {"active-key", "old-key", "gone-key"} - {name})
    listing = admin_client.get("/admin/accounts/apikey/?state=active").content.decode()
    assert "0.000102" in listing and "5.00" in listing
    # The budget is edited on the key's page in credits.
    change = admin_client.get(f"/admin/accounts/apikey/{active.pk}/change/").content.decode()
    assert 'name="budget"' in change and 'value="5.000000"' in change


def test_account_with_its_dashboard_login(admin_client):
    response = admin_client.post(
        "/admin/accounts/account/add/",
        {
            "name": "Newco",
            "owner_email": "owner@newco.example",
            "owner_password": "long-enough-pw",
            "memberships-TOTAL_FORMS": "0",
            "memberships-INITIAL_FORMS": "0",
        },
        follow=True,
    )
    assert response.status_code == 200
    account = Account.objects.get(name="Newco")
    user = get_user_model().objects.get(username="owner@newco.example")
    assert user.membership.account == account
    assert Client().login(username="owner@newco.example", password="long-enough-pw")
