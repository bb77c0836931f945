"""The customer dashboard: owner / outsider / anonymous personas on every page and action."""

from __future__ import annotations

import csv
import io
import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from accounts.models import ApiKey
from accounts.services import account_user_create
from billing.models import UsageRecord
from billing.services import credits_reserve, reservation_settle
from core.credits import MICRO
from core.models import AuditLog
from core.outcome import RequestOutcome
from tests.factories import make_account, make_key, make_model

pytestmark = pytest.mark.django_db
PASSWORD = "correct horse battery staple"


@pytest.fixture
def model():
    return make_model(model_id="acme/dash-model", input_price=2 * MICRO, output_price=4 * MICRO)


@pytest.fixture
def owner_account():
    return make_account(name="Owner Co", credits=100)


@pytest.fixture
def outsider_account():
    return make_account(name="Outsider Inc", credits=7)


@pytest.fixture
def owner(owner_account) -> Client:
    account_user_create(account=owner_account, email="owner@example.com", password=PASSWORD)
    client = Client()
    assert client.login(username="owner@example.com", password=PASSWORD)
    return client


@pytest.fixture
def outsider(outsider_account) -> Client:
    account_user_create(account=outsider_account, email="outsider@example.com", password=PASSWORD)
    client = Client()
    assert client.login(username="outsider@example.com", password=PASSWORD)
    return client


def settle(account, model, *, prompt=1000, completion=500, request_id="req-1", latency_ms=120) -> UsageRecord:
    reservation = credits_reserve(account_id=account.pk, amount=MICRO, model=model, request_id=request_id)
    record = reservation_settle(
        reservation_id=reservation.pk,
        prompt_tokens=prompt,
        completion_tokens=completion,
        outcome=RequestOutcome(request_id="", worker_id="w1", endpoint="chat", latency=(latency_ms) / 1000),
    )
    assert record is not None
    return record


def test_it_signs_in_with_email_and_password(owner_account):
    account_user_create(account=owner_account, email="owner@example.com", password=PASSWORD)
    client = Client()
    page = client.get("/accounts/login/")
    assert page.status_code == 200 and b"Sign in" in page.content
    response = client.post("/accounts/login/", {"username": "owner@example.com", "password": PASSWORD})
    assert response.status_code == 302 and response["Location"] == "/dashboard/"
    assert b"Owner Co" in client.get("/dashboard/").content


@pytest.mark.parametrize("url", ["/dashboard/", "/dashboard/usage/", "/dashboard/usage.csv", "/dashboard/keys/"])
def test_anonymous_is_sent_to_login(client, url):
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


def test_anonymous_cannot_revoke(client, owner_account):
    key = make_key(account=owner_account).api_key
    response = client.post(f"/dashboard/keys/{key.pk}/revoke/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    key.refresh_from_db()
    assert key.revoked_at is None


def test_home_shows_own_balance_spend_and_today(owner, owner_account, outsider_account, model):
    settle(owner_account, model, prompt=1000, completion=500)  # cost 0.002 + 0.002 = 0.004
    settle(outsider_account, model, prompt=9, completion=9, request_id="req-out")
    page = owner.get("/dashboard/")
    html = page.content.decode()
    assert page.status_code == 200
    assert "Owner Co" in html and "Outsider Inc" not in html
    assert "99.996000 credits" in html  # exact balance in the title attribute
    # today: one request, 1,500 tokens
    assert 'id="requests-today">1</span>' in html and 'id="tokens-today">1,500</span> tokens' in html
    assert "req-out" not in html


def test_usage_page_shows_only_own_rows_and_chart_data(owner, owner_account, outsider_account, model):
    settle(owner_account, model, request_id="mine-1", latency_ms=321)
    settle(outsider_account, model, request_id="theirs-1")
    page = owner.get("/dashboard/usage/")
    html = page.content.decode()
    assert page.status_code == 200
    assert "321 ms" in html
    assert 'id="chart-data"' in html and "acme/dash-model" in html
    chart = page.context["chart"]
    assert sum(chart["tokens"]["acme/dash-model"]) == 1500
    assert len(chart["days"]) == 30
    assert "chart.umd.min.js" in html  # served from our static files, no CDN
    assert "http://" not in html.split("<body>")[0].replace("http://www.w3.org", "")


def test_usage_range_and_bad_range(owner, owner_account, model):
    record = settle(owner_account, model)
    UsageRecord.objects.filter(pk=record.pk).update(created_at=timezone.now() - timedelta(days=40))
    recent = owner.get("/dashboard/usage/")
    assert recent.context["per_model"] == []
    start = (timezone.localdate() - timedelta(days=45)).isoformat()
    wide = owner.get(f"/dashboard/usage/?start={start}")
    assert dict(wide.context["per_model"])["acme/dash-model"]["requests"] == 1
    bad = owner.get("/dashboard/usage/?start=2024-05-02&end=2024-05-01")
    assert bad.status_code == 200 and b"must not be after" in bad.content


def test_usage_csv_has_only_own_rows(owner, outsider, owner_account, outsider_account, model):
    settle(owner_account, model, request_id="mine-1")
    settle(outsider_account, model, request_id="theirs-1")
    response = owner.get("/dashboard/usage.csv")
    assert response.status_code == 200 and response["Content-Type"] == "text/csv"
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert [r["request_id"] for r in rows] == ["mine-1"]
    assert rows[0]["cost_credits"] == "0.004000" and rows[0]["prompt_tokens"] == "1000"
    theirs = list(
        csv.DictReader(io.StringIO(b"".join(outsider.get("/dashboard/usage.csv").streaming_content).decode()))
    )
    assert [r["request_id"] for r in theirs] == ["theirs-1"]


def test_keys_page_lists_only_own_keys(owner, owner_account, outsider_account):
    mine = make_key(account=owner_account, name="mine").api_key
    spare = make_key(account=owner_account, name="spare").api_key
    theirs = make_key(account=outsider_account, name="theirs").api_key
    html = owner.get("/dashboard/keys/").content.decode()
    # One table row per key of the owner's account (each carries its prefix), none of the outsider's.
    rows = dict(re.findall(r'<tr[^>]* data-key="([^"]+)">\s*<td[^>]*>([^<]*)<br>', html))
    assert rows == {mine.prefix: "mine", spare.prefix: "spare"}
    assert theirs.prefix not in html and "theirs" not in html


def test_it_creates_a_key_and_shows_the_secret_once(owner, owner_account, model):
    expires = (timezone.localdate() + timedelta(days=10)).isoformat()
    response = owner.post(
        "/dashboard/keys/",
        {"name": "ci", "scopes": ["chat", "models"], "allowed_models": ["acme/dash-model"], "expires": expires},
    )
    # Post/redirect/get: the POST creates and redirects; the GET shows the secret once.
    assert response.status_code == 302 and response["Location"] == "/dashboard/keys/created/"
    response = owner.get(response["Location"])
    assert response.status_code == 200
    secret = response.context["created"]["secret"]
    assert secret.startswith("sk-si-") and secret in response.content.decode()
    assert response["Cache-Control"] == "no-store"
    key = ApiKey.objects.get(account=owner_account, name="ci")
    assert key.scopes == ["chat", "models"] and key.allowed_models == ["acme/dash-model"]
    assert key.expires_at is not None and key.expires_at.date().isoformat() == expires
    assert secret not in owner.get("/dashboard/keys/").content.decode()
    # A reload neither shows the secret again nor creates a second key.
    reload = owner.get("/dashboard/keys/created/", follow=True)
    assert secret not in reload.content.decode() and b"shown once" in reload.content
    assert ApiKey.objects.filter(account=owner_account).count() == 1
    assert AuditLog.objects.filter(action="key.create", target_id=str(key.pk), actor="owner@example.com").exists()


def test_a_customer_cannot_create_an_admin_key(owner, owner_account):
    response = owner.post("/dashboard/keys/", {"name": "sneaky", "scopes": ["admin"]})
    assert response.status_code == 400
    assert not ApiKey.objects.filter(name="sneaky").exists()


def test_key_form_rejects_past_expiry(owner):
    response = owner.post("/dashboard/keys/", {"name": "old", "scopes": ["chat"], "expires": "2020-01-01"})
    assert response.status_code == 400 and b"after today" in response.content


def test_owner_revokes_own_key(owner, owner_account):
    key = make_key(account=owner_account, name="mine").api_key
    response = owner.post(f"/dashboard/keys/{key.pk}/revoke/")
    assert response.status_code == 302
    key.refresh_from_db()
    assert key.revoked_at is not None


def test_outsider_gets_404_for_another_accounts_key(outsider, owner_account):
    key = make_key(account=owner_account, name="mine").api_key
    assert outsider.post(f"/dashboard/keys/{key.pk}/revoke/").status_code == 404
    key.refresh_from_db()
    assert key.revoked_at is None


def test_revoke_needs_post(owner, owner_account):
    key = make_key(account=owner_account).api_key
    assert owner.get(f"/dashboard/keys/{key.pk}/revoke/").status_code == 405


def test_user_without_account_sees_no_dashboard(django_user_model):
    django_user_model.objects.create_user(username="staff@example.com", password=PASSWORD, is_staff=True)
    client = Client()
    client.login(username="staff@example.com", password=PASSWORD)
    for url in ("/dashboard/", "/dashboard/usage/", "/dashboard/keys/", "/dashboard/usage.csv"):
        assert client.get(url).status_code == 403


def test_pages_render_without_javascript_features(owner, owner_account):
    """Forms are plain HTML posts: every action works with JavaScript off."""
    html = owner.get("/dashboard/keys/").content.decode()
    assert 'method="post"' in html and "csrfmiddlewaretoken" in html
    assert "<noscript>" in owner.get("/dashboard/usage/").content.decode()


def test_static_chart_library_is_served(client):
    response = client.get("/static/vendor/chartjs/chart.umd.min.js")
    assert response.status_code == 200
    assert b"Chart.js v4" in b"".join(response.streaming_content)[:400]


def test_key_budget_is_set_at_creation_and_changed_and_spend_shows_per_key(owner, owner_account, model):
    response = owner.post("/dashboard/keys/", {"name": "ci", "scopes": ["chat"], "budget": "5"})
    assert response.status_code == 302
    key = ApiKey.objects.get(name="ci")
    assert key.monthly_budget == 5 * MICRO
    reservation = credits_reserve(
        account_id=owner_account.pk, amount=MICRO, model=model, api_key_id=key.pk, budget=key.monthly_budget
    )
    reservation_settle(reservation_id=reservation.pk, prompt_tokens=100, completion_tokens=1)  # 0.000204
    html = owner.get("/dashboard/keys/").content.decode()
    assert "0.000204" in html and 'value="5.00"' in html
    assert "data-confirm=" in html and "just now" not in html  # never used through the gateway
    assert owner.post(f"/dashboard/keys/{key.pk}/budget/", {"budget": "0.5"}).status_code == 302
    key.refresh_from_db()
    assert key.monthly_budget == 500_000
    assert AuditLog.objects.filter(action="key.budget", target_id=str(key.pk)).exists()
    owner.post(f"/dashboard/keys/{key.pk}/budget/", {"budget": ""})
    key.refresh_from_db()
    assert key.monthly_budget is None
    bad = owner.post(f"/dashboard/keys/{key.pk}/budget/", {"budget": "lots"}, follow=True)
    assert b"Not a decimal number: &#x27;lots&#x27;" in bad.content


def test_outsider_cannot_set_anothers_budget(outsider, owner_account):
    key = make_key(account=owner_account).api_key
    assert outsider.post(f"/dashboard/keys/{key.pk}/budget/", {"budget": "1"}).status_code == 404


def test_models_page_shows_prices_per_million_and_whether_up(owner, model):
    from workers.models import Worker

    make_model(model_id="acme/idle", input_price=500_000, output_price=1_500_000, max_output_tokens=128)
    Worker.objects.create(
        worker_id="w-1",
        runtime="cuda",
        transport="openai",
        runtime_endpoint="http://127.0.0.1:9",
        supported_models=["acme/dash-model"],
        healthy=True,
        model_readiness={"acme/dash-model": True},
    )
    page = owner.get("/dashboard/models/")
    rows = {m.model_id: m for m in page.context["models"]}
    assert rows["acme/dash-model"].up and not rows["acme/idle"].up
    html = page.content.decode()
    assert "0.50" in html and "1.50" in html and "128" in html


def test_home_cards_show_a_small_spend(owner, owner_account, model):
    settle(owner_account, model, prompt=100, completion=1)  # 0.000204 credits
    html = owner.get("/dashboard/").content.decode()
    assert ">0.000204</span>" in html  # the spend card, no longer "0.00"


def test_login_error_speaks_of_the_email_address(owner_account):
    page = Client().post("/accounts/login/", {"username": "who@example.com", "password": "nope"})
    assert (
        b"email address and password do not match" in page.content
        and b"username" not in page.content.lower().split(b"<form")[0]
    )


def test_cached_and_reasoning_tokens_show_on_the_dashboard_and_in_the_csv(owner, owner_account, model):
    reservation = credits_reserve(account_id=owner_account.pk, amount=MICRO, model=model, request_id="cached-1")
    reservation_settle(
        reservation_id=reservation.pk,
        prompt_tokens=1000,
        completion_tokens=500,
        cached_tokens=800,
        reasoning_tokens=300,
    )
    page = owner.get("/dashboard/").content.decode()
    assert "800 cached" in page and "300 reasoning" in page
    rows = list(csv.DictReader(io.StringIO(b"".join(owner.get("/dashboard/usage.csv").streaming_content).decode())))
    assert (rows[0]["cached_tokens"], rows[0]["reasoning_tokens"]) == ("800", "300")
