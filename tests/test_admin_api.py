"""The staff REST API for accounts, keys, credits and models."""

from __future__ import annotations

import pytest
from django.test import Client

from accounts.models import ApiKey
from accounts.selectors import api_key_authenticate
from billing.models import LedgerEntry
from catalog.models import PublicModel
from core.credits import MICRO
from core.models import AuditLog
from tests.factories import make_account, make_key, make_model

pytestmark = pytest.mark.django_db
PASSWORD = "correct horse battery staple"


@pytest.fixture
def admin_key_headers() -> dict[str, str]:
    created = make_key(account=make_account(name="Staff tools"), scopes=["admin"])
    return {"HTTP_AUTHORIZATION": f"Bearer {created.secret}"}


def test_it_requires_staff_or_admin_key(client, django_user_model):
    response = client.get("/api/accounts/")
    assert response.status_code == 401
    assert set(response.json()["error"]) == {"message", "type", "code", "param"}
    django_user_model.objects.create_user(username="c@example.com", password=PASSWORD)
    client.login(username="c@example.com", password=PASSWORD)
    assert client.get("/api/accounts/").status_code == 403
    plain = make_key(account=make_account(name="X"))
    assert Client().get("/api/accounts/", HTTP_AUTHORIZATION=f"Bearer {plain.secret}").status_code == 403
    bad = Client().get("/api/accounts/", HTTP_AUTHORIZATION="Bearer sk-si-nope")
    assert bad.status_code == 401 and bad.json()["error"]["code"] == "invalid_api_key"
    assert bad["WWW-Authenticate"] == "Bearer"


def test_accounts_list_create_detail(staff):
    make_account(name="Acme", credits=3)
    listing = staff.get("/api/accounts/").json()["data"]
    assert [(a["name"], a["balance"], a["reserved"]) for a in listing] == [("Acme", "3.000000", "0.000000")]
    created = staff.post(
        "/api/accounts/",
        {"name": "NewCo", "owner": "boss@newco.example", "password": PASSWORD},
        content_type="application/json",
    )
    assert created.status_code == 201 and created.json()["balance"] == "0.000000"
    assert Client().login(username="boss@newco.example", password=PASSWORD)
    detail = staff.get(f"/api/accounts/{created.json()['id']}/")
    assert detail.json()["name"] == "NewCo"
    duplicate = staff.post("/api/accounts/", {"name": "NewCo"}, content_type="application/json")
    assert duplicate.status_code == 400 and duplicate.json()["error"]["param"] == "name"
    assert staff.get("/api/accounts/999999/").status_code == 404


def test_grant_credits_with_note(staff, admin_key_headers):
    account = make_account(name="Acme")
    missing_note = staff.post(f"/api/accounts/{account.pk}/credits/", {"amount": "5"}, content_type="application/json")
    assert missing_note.status_code == 400 and missing_note.json()["error"]["param"] == "note"
    bad = staff.post(
        f"/api/accounts/{account.pk}/credits/", {"amount": "1.0000001", "note": "x"}, content_type="application/json"
    )
    assert bad.status_code == 400
    done = Client().post(
        f"/api/accounts/{account.pk}/credits/",
        {"amount": "12.5", "note": "invoice 42"},
        content_type="application/json",
        **admin_key_headers,
    )
    assert done.status_code == 201 and done.json()["account"]["balance"] == "12.500000"
    entry = LedgerEntry.objects.get(account=account)
    assert entry.note == "invoice 42" and entry.actor.startswith("apikey:sk-si-")
    assert AuditLog.objects.get(action="credits.grant").actor.startswith("apikey:")
    too_much = staff.post(
        f"/api/accounts/{account.pk}/credits/", {"amount": "-20", "note": "x"}, content_type="application/json"
    )
    assert too_much.status_code == 400


def test_a_bad_amount_names_its_field_once(staff):
    account = make_account(name="Acme")
    bad = staff.post(
        f"/api/accounts/{account.pk}/credits/", {"amount": "abc", "note": "x"}, content_type="application/json"
    )
    error = bad.json()["error"]
    assert bad.status_code == 400 and error["param"] == "amount"
    assert error["message"] == "amount: not a decimal number: 'abc'"
    price = staff.post(
        "/api/models/", {"id": "acme/p", "input_price": "x", "output_price": "1"}, content_type="application/json"
    )
    assert price.status_code == 400 and price.json()["error"]["message"] == "input_price: not a decimal number: 'x'"


def test_keys_create_list_revoke(staff):
    account = make_account(name="Acme")
    make_model(model_id="acme/m1")
    created = staff.post(
        f"/api/accounts/{account.pk}/keys/",
        {"name": "ci", "scopes": ["chat"], "models": ["acme/m1"], "rpm": 10},
        content_type="application/json",
    )
    assert created.status_code == 201
    body = created.json()
    secret = body["secret"]
    assert api_key_authenticate(raw_key=secret).key is not None
    assert body["scopes"] == ["chat"] and body["models"] == ["acme/m1"] and body["rate_limit"]["rpm"] == 10
    listing = staff.get(f"/api/accounts/{account.pk}/keys/").json()["data"]
    assert [k["name"] for k in listing] == ["ci"] and "secret" not in listing[0]
    assert secret not in staff.get("/api/keys/").content.decode()
    unknown = staff.post(f"/api/accounts/{account.pk}/keys/", {"models": ["nope/x"]}, content_type="application/json")
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "models"
    revoked = staff.post(f"/api/keys/{body['id']}/revoke/")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
    assert api_key_authenticate(raw_key=secret).reason == "revoked"
    assert ApiKey.objects.get(pk=body["id"]).revoked_at is not None
    assert {a.action for a in AuditLog.objects.all()} == {"key.create", "key.revoke"}


def test_key_budget_through_the_staff_api(staff):
    account = make_account(name="Acme")
    created = staff.post(
        f"/api/accounts/{account.pk}/keys/", {"name": "ci", "budget": "5"}, content_type="application/json"
    ).json()
    assert created["budget"]["limit"] == "5.000000" and created["budget"]["spent"] == "0.000000"
    changed = staff.post(f"/api/keys/{created['id']}/budget/", {"budget": "0.25"}, content_type="application/json")
    assert changed.status_code == 200 and changed.json()["budget"]["limit"] == "0.250000"
    removed = staff.post(f"/api/keys/{created['id']}/budget/", {"budget": None}, content_type="application/json")
    assert removed.json()["budget"] is None
    bad = staff.post(f"/api/keys/{created['id']}/budget/", {"budget": "-1"}, content_type="application/json")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "budget"
    assert AuditLog.objects.filter(action="key.budget").count() == 2


def test_models_list_create_update(staff):
    created = staff.post(
        "/api/models/",
        {"id": "acme/llama-3-8b", "input_price": "0.2", "output_price": "0.6", "max_output_tokens": 1024},
        content_type="application/json",
    )
    assert created.status_code == 201
    assert created.json() == {
        **created.json(),
        "id": "acme/llama-3-8b",
        "input_price": "0.200000",
        "output_price": "0.600000",
        "max_output_tokens": 1024,
    }
    assert [m["id"] for m in staff.get("/api/models/").json()["data"]] == ["acme/llama-3-8b"]
    updated = staff.patch("/api/models/acme/llama-3-8b", {"output_price": "0.8"}, content_type="application/json")
    assert updated.status_code == 200 and updated.json()["output_price"] == "0.800000"
    model = PublicModel.objects.get(model_id="acme/llama-3-8b")
    assert (model.input_price, model.output_price) == (200_000, 800_000)
    negative = staff.patch("/api/models/acme/llama-3-8b", {"input_price": "-1"}, content_type="application/json")
    assert negative.status_code == 400 and negative.json()["error"]["param"] == "input_price"
    assert staff.get("/api/models/nope/x").status_code == 404
    audit = AuditLog.objects.get(action="model.update")
    assert audit.detail["previous_output_price"] == "0.600000" and audit.detail["output_price"] == "0.800000"
    assert model.input_price == 2 * MICRO // 10


def test_a_models_kind_through_the_staff_api(staff):
    created = staff.post(
        "/api/models/",
        {"id": "acme/rerank-1", "input_price": "0.1", "output_price": "0", "kind": "rerank"},
        content_type="application/json",
    )
    assert created.status_code == 201 and created.json()["kind"] == "rerank"
    refused = staff.post(
        "/api/models/",
        {"id": "acme/y", "input_price": "1", "output_price": "1", "kind": "vision"},
        content_type="application/json",
    )
    assert refused.status_code == 400


def test_key_priority_through_the_staff_api(staff):
    account = make_account(name="acme")
    created = staff.post(
        f"/api/accounts/{account.pk}/keys/", {"name": "batch", "priority": "low"}, content_type="application/json"
    )
    assert created.status_code == 201 and created.json()["priority"] == "low"
    assert ApiKey.objects.get(pk=created.json()["id"]).priority == "low"
    refused = staff.post(f"/api/accounts/{account.pk}/keys/", {"priority": "urgent"}, content_type="application/json")
    assert refused.status_code == 400 and "priority" in refused.json()["error"]["message"]
