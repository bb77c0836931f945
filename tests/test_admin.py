"""The staff admin: who may see it, and that every action goes through the services."""

from __future__ import annotations

import csv
import io

import pytest
from django.test import Client

from accounts.models import Account, ApiKey
from accounts.selectors import api_key_authenticate
from billing.models import LedgerEntry
from billing.services import credits_reserve, reservation_settle
from catalog.models import PublicModel
from core.credits import MICRO
from core.models import AuditLog
from core.outcome import RequestOutcome
from tests.factories import make_account, make_key, make_model

pytestmark = pytest.mark.django_db
PASSWORD = "correct horse battery staple"


@pytest.fixture
def customer(django_user_model) -> Client:
    django_user_model.objects.create_user(username="c@example.com", password=PASSWORD)
    client = Client()
    assert client.login(username="c@example.com", password=PASSWORD)
    return client


@pytest.mark.parametrize(
    "url",
    [
        "/admin/",
        "/admin/accounts/account/",
        "/admin/accounts/apikey/add/",
        "/admin/billing/usagerecord/",
        "/admin/billing/usagerecord/export.csv",
        "/admin/core/auditlog/",
    ],
)
def test_non_staff_and_anonymous_get_the_login_page(client, customer, url):
    for who in (client, customer):
        response = who.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/")


@pytest.mark.parametrize(
    ("url", "shows"),
    [
        # What a staff member comes to each page for: the rows that exist, or the form's fields.
        ("/admin/", ["Workers, models, accounts and money", 'href="/admin/accounts/account/"']),
        ("/admin/accounts/account/", ["Acme", "1.00"]),  # 1.00 held by req-held
        ("/admin/accounts/account/add/", ['name="name"']),
        ("/admin/accounts/apikey/", ["deploy-bot", "Acme"]),
        ("/admin/accounts/apikey/add/", ['name="account"', 'name="name"', 'name="scopes"', 'name="rpm"']),
        ("/admin/core/auditlog/", ["credits.grant", "Acme"]),
        ("/admin/catalog/publicmodel/", ["acme/model-1"]),
        ("/admin/catalog/publicmodel/add/", ['name="model_id"', 'name="input_price_credits"']),
        ("/admin/billing/ledgerentry/", ["Acme", "5.00"]),
        ("/admin/billing/reservation/", ["req-held", "req-settled", "Acme"]),
        ("/admin/billing/usagerecord/", ["req-settled", "acme/model-1"]),
    ],
)
def test_staff_pages_render(admin_client, url, shows):
    account = make_account(name="Acme", credits=5)
    model = make_model(model_id="acme/model-1")
    make_key(account=account, name="deploy-bot")
    credits_reserve(account_id=account.pk, amount=MICRO, model=model, request_id="req-held")
    settled = credits_reserve(account_id=account.pk, amount=MICRO, model=model, request_id="req-settled")
    reservation_settle(reservation_id=settled.pk, prompt_tokens=10, completion_tokens=5)
    response = admin_client.get(url)
    assert response.status_code == 200
    html = response.content.decode()
    assert "SpeedInfer admin" in html  # the branded admin, not a bare or error page
    missing = [text for text in shows if text not in html]
    assert not missing, f"{url} does not show {missing}"
    if "cl" in response.context:  # a change list: every stored row is listed, none left off
        cl = response.context["cl"]
        assert len(cl.result_list) == cl.model.objects.count() > 0


def test_account_shows_credits_read_only(admin_client):
    account = make_account(name="Acme", credits=12)
    listing = admin_client.get("/admin/accounts/account/").content.decode()
    assert "12.00" in listing  # credits shown as everywhere else (core.credits.display_credits)
    page = admin_client.get(f"/admin/accounts/account/{account.pk}/change/")
    html = page.content.decode()
    assert "12.00" in html
    assert 'name="available"' not in html and 'name="reserved"' not in html
    admin_client.post(f"/admin/accounts/account/{account.pk}/change/", {"available": "999"})
    account.refresh_from_db()
    assert account.available == 12 * MICRO


def test_staff_creates_an_account(admin_client):
    response = admin_client.post(
        "/admin/accounts/account/add/",
        {"name": "NewCo", "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0"},
    )
    assert response.status_code == 302
    account = Account.objects.get(name="NewCo")
    assert AuditLog.objects.filter(action="account.create", target_id=str(account.pk)).exists()


def test_grant_credits_form_needs_a_note_and_uses_the_ledger(admin_client):
    account = make_account(name="Acme")
    url = f"/admin/accounts/account/{account.pk}/grant/"
    assert admin_client.get(url).status_code == 200
    missing = admin_client.post(url, {"amount": "5"})
    assert missing.status_code == 200 and b"required" in missing.content
    account.refresh_from_db()
    assert account.available == 0
    done = admin_client.post(url, {"amount": "5.5", "note": "trial"})
    assert done.status_code == 302
    account.refresh_from_db()
    assert account.available == 5_500_000
    entry = LedgerEntry.objects.get(account=account, kind="grant")
    assert (entry.amount, entry.actor, entry.note) == (5_500_000, "admin", "trial")
    audit = AuditLog.objects.get(action="credits.grant")
    assert audit.actor == "admin" and audit.detail["amount"] == "5.500000" and audit.detail["note"] == "trial"


def test_grant_credits_action_on_several_accounts(admin_client):
    a, b = make_account(name="A"), make_account(name="B")
    data = {"action": "grant_credits", "_selected_action": [a.pk, b.pk]}
    form = admin_client.post("/admin/accounts/account/", data)
    assert form.status_code == 200 and b"Grant credits" in form.content
    admin_client.post("/admin/accounts/account/", {**data, "apply": "1", "amount": "2", "note": "promo"})
    assert sorted(Account.objects.values_list("available", flat=True)) == [2 * MICRO, 2 * MICRO]


def test_removing_more_than_available_is_refused(admin_client):
    account = make_account(name="Acme", credits=1)
    audited = AuditLog.objects.filter(action="credits.grant").count()  # the factory's own grant
    admin_client.post(f"/admin/accounts/account/{account.pk}/grant/", {"amount": "-5", "note": "oops"})
    account.refresh_from_db()
    assert account.available == MICRO
    assert AuditLog.objects.filter(action="credits.grant").count() == audited


def test_ledger_is_read_only_and_filterable(admin_client):
    a = make_account(name="Acme", credits=3)
    make_account(name="Other", credits=4)
    entry = LedgerEntry.objects.get(account=a)
    page = admin_client.get(f"/admin/billing/ledgerentry/?account__id__exact={a.pk}&kind__exact=grant")
    assert page.status_code == 200
    assert list(page.context["cl"].result_list) == [entry]
    assert (
        admin_client.get("/admin/billing/ledgerentry/?created_at__gte=2000-01-01+00:00:00%2B00:00").status_code == 200
    )
    assert admin_client.post(f"/admin/billing/ledgerentry/{entry.pk}/delete/").status_code == 403
    assert admin_client.get("/admin/billing/ledgerentry/add/").status_code == 403


def test_create_key_shows_the_secret_once(admin_client):
    account = make_account(name="Acme")
    make_model(model_id="acme/m1")
    response = admin_client.post(
        "/admin/accounts/apikey/add/",
        {
            "account": account.pk,
            "name": "ops",
            "scopes": ["chat", "usage"],
            "allowed_models": ["acme/m1"],
            "rpm": "60",
            "tpm": "",
            "expires_at_0": "",
            "expires_at_1": "",
        },
    )
    # Post/redirect/get: the secret is shown by the GET that follows, once.
    assert response.status_code == 302 and response["Location"] == "/admin/accounts/apikey/created/"
    response = admin_client.get(response["Location"])
    assert response.status_code == 200
    secret = response.context["secret"]
    assert secret.startswith("sk-si-") and secret in response.content.decode()
    assert b"Copy" in response.content
    key = ApiKey.objects.get(name="ops")
    assert key.scopes == ["chat", "usage"] and key.allowed_models == ["acme/m1"] and key.rpm == 60
    assert api_key_authenticate(raw_key=secret).key is not None
    change = admin_client.get(f"/admin/accounts/apikey/{key.pk}/change/").content.decode()
    assert secret not in change and key.digest in change  # digest shown, read-only
    assert 'name="digest"' not in change
    assert AuditLog.objects.filter(action="key.create", target_id=str(key.pk), actor="admin").exists()
    reload = admin_client.get("/admin/accounts/apikey/created/", follow=True)
    assert secret not in reload.content.decode() and b"shown once" in reload.content
    assert ApiKey.objects.filter(name="ops").count() == 1


def test_key_widgets_are_checkboxes(admin_client):
    make_model(model_id="acme/m1")
    html = admin_client.get("/admin/accounts/apikey/add/").content.decode()
    assert 'type="checkbox" name="scopes" value="admin"' in html
    assert 'type="checkbox" name="allowed_models" value="acme/m1"' in html


def test_edit_key_scopes_through_the_service(admin_client):
    account = make_account(name="Acme")
    created = make_key(account=account, name="k")
    key = created.api_key
    response = admin_client.post(
        f"/admin/accounts/apikey/{key.pk}/change/",
        {"name": "k2", "scopes": ["models"], "rpm": "", "tpm": "", "expires_at_0": "", "expires_at_1": ""},
    )
    assert response.status_code == 302
    key.refresh_from_db()
    assert key.name == "k2" and key.scopes == ["models"]
    info = api_key_authenticate(raw_key=created.secret).key
    assert info is not None and info.scopes == frozenset({"models"})
    assert AuditLog.objects.filter(action="key.update", target_id=str(key.pk)).exists()


def test_revoke_action(admin_client):
    account = make_account(name="Acme")
    created = make_key(account=account, name="k")
    admin_client.post("/admin/accounts/apikey/", {"action": "revoke_keys", "_selected_action": [created.api_key.pk]})
    created.api_key.refresh_from_db()
    assert created.api_key.revoked_at is not None
    assert api_key_authenticate(raw_key=created.secret).reason == "revoked"
    assert AuditLog.objects.filter(action="key.revoke").count() == 1


def test_search_keys_by_prefix_or_name(admin_client):
    account = make_account(name="Acme")
    key = make_key(account=account, name="findme").api_key
    other = make_key(account=account, name="other").api_key
    by_prefix = admin_client.get("/admin/accounts/apikey/", {"q": key.prefix})
    assert list(by_prefix.context["cl"].result_list) == [key]
    by_name = admin_client.get("/admin/accounts/apikey/", {"q": "findme"})
    assert other not in list(by_name.context["cl"].result_list)


def test_model_prices_entered_as_credits(admin_client):
    response = admin_client.post(
        "/admin/catalog/publicmodel/add/",
        {
            "model_id": "acme/new",
            "input_price_credits": "0.5",
            "output_price_credits": "1.25",
            "max_output_tokens": "2048",
        },
    )
    assert response.status_code == 302
    model = PublicModel.objects.get(model_id="acme/new")
    assert (model.input_price, model.output_price, model.max_output_tokens) == (500_000, 1_250_000, 2048)
    listing = admin_client.get("/admin/catalog/publicmodel/").content.decode()
    assert "0.50" in listing and "1.25" in listing
    admin_client.post(
        f"/admin/catalog/publicmodel/{model.pk}/change/",
        {"input_price_credits": "0.75", "output_price_credits": "1.25", "max_output_tokens": "2048"},
    )
    model.refresh_from_db()
    assert model.input_price == 750_000
    audit = AuditLog.objects.get(action="model.update")
    assert audit.detail["input_price"] == "0.750000" and audit.detail["previous_input_price"] == "0.500000"


def test_usage_is_read_only_filterable_and_exports_csv(admin_client):
    model = make_model(model_id="acme/m1")
    a, b = make_account(name="A", credits=10), make_account(name="B", credits=10)
    for account, rid in ((a, "ra"), (b, "rb")):
        reservation = credits_reserve(account_id=account.pk, amount=MICRO, model=model, request_id=rid)
        reservation_settle(
            reservation_id=reservation.pk,
            prompt_tokens=10,
            completion_tokens=5,
            outcome=RequestOutcome(request_id="", worker_id="w1", latency=(50) / 1000),
        )
    page = admin_client.get(f"/admin/billing/usagerecord/?account__id__exact={a.pk}&model_id=acme/m1&status__exact=ok")
    assert [r.request_id for r in page.context["cl"].result_list] == ["ra"]
    assert b"Export CSV" in page.content
    export = admin_client.get(f"/admin/billing/usagerecord/export.csv?account__id__exact={a.pk}")
    rows = list(csv.DictReader(io.StringIO(b"".join(export.streaming_content).decode())))
    assert [r["request_id"] for r in rows] == ["ra"] and rows[0]["account"] == "A" and rows[0]["worker"] == "w1"
    record = page.context["cl"].result_list[0]
    selected = admin_client.post(
        "/admin/billing/usagerecord/", {"action": "export_csv", "_selected_action": [record.pk]}
    )
    assert b"ra" in b"".join(selected.streaming_content)
    assert admin_client.get("/admin/billing/usagerecord/add/").status_code == 403


def test_audit_log_is_read_only(admin_client):
    make_account(name="Acme")
    from core.audit import audit_record

    entry = audit_record(actor="someone", action="worker.disable", target="gpu-1", detail={"why": "test"})
    page = admin_client.get("/admin/core/auditlog/")
    assert b"worker.disable" in page.content
    assert admin_client.post(f"/admin/core/auditlog/{entry.pk}/delete/").status_code == 403
    assert admin_client.get("/admin/core/auditlog/add/").status_code == 403
