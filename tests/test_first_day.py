"""What a first day tripped over (issue 21), each as a customer or staff member would notice it."""

from __future__ import annotations

import re
import time
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.test import Client

from accounts.models import ApiKey
from accounts.services import account_user_create
from billing.models import UsageRecord
from console.templatetags.credits import duration_words, tokens
from core import refusals
from core.credits import MICRO, display_credits
from core.models import AuditLog
from tests.factories import make_account, make_key, make_model
from tests.servers import register_worker

PASSWORD = "correct horse battery staple"
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(autouse=True)
def _no_old_refusals():
    """Refusal counts live in the cache, keyed by account id; a fresh test database reuses the ids."""
    from django.core.cache import cache

    refusals.reset()
    cache.clear()


@pytest.fixture
def owner_account(db):
    return make_account(name="First Day Co", credits=100)


@pytest.fixture
def owner(owner_account) -> Client:
    account_user_create(account=owner_account, email="first@example.com", password=PASSWORD)
    client = Client()
    assert client.login(username="first@example.com", password=PASSWORD)
    return client


@pytest.fixture
def staff(django_user_model) -> Client:
    django_user_model.objects.create_superuser(username="ops", email="ops@example.com", password=PASSWORD)
    client = Client()
    assert client.login(username="ops", password=PASSWORD)
    return client


# 1. The landing page's links are buttons that wrap as boxes, and the primary one is styled.
def test_landing_buttons_are_boxes_and_the_primary_one_is_styled(client, db):
    css = (Path(settings.BASE_DIR) / "static" / "css" / "app.css").read_text()
    assert re.search(r"\.button \{[^}]*display: inline-block", css)
    assert ".button.primary" in css
    html = client.get("/").content.decode()
    assert 'class="button primary"' in html and 'class="actions"' in html


# 2. The prices are public.
def test_anyone_sees_the_models_prices_and_whether_they_are_up(client, db, simulator):
    make_model(model_id="acme/model-1", input_price=1_500_000, output_price=2 * MICRO, max_output_tokens=16384)
    make_model(model_id="acme/offline")
    register_worker(simulator.base_url)
    landing = client.get("/").content.decode()
    assert 'href="/models/">Models and prices' in landing
    page = client.get("/models/")
    html = page.content.decode()
    assert page.status_code == 200
    row = _row(html, "acme/model-1")
    assert "1.50" in row and "2.00" in row and "16,384" in row and ">up<" in row
    assert ">down<" in _row(html, "acme/offline")
    assert simulator.base_url not in html and "sim-1" not in html


def _row(html: str, model_id: str) -> str:
    found = re.search(rf'<tr data-model="{re.escape(model_id)}">(.*?)</tr>', html, re.S)
    assert found, model_id
    return found.group(1)


# 4. Refused requests are counted for the customer, with their codes; nothing charged, no usage row.
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_gateway")
def test_refused_requests_show_on_the_dashboard_with_their_codes(gateway_server, simulator):
    refusals.reset()
    make_model(model_id="acme/model-1", max_output_tokens=64)
    register_worker(simulator.base_url)
    poor = make_account(name="Poor Co")
    account_user_create(account=poor, email="poor@example.com", password=PASSWORD)
    broke = make_key(account=poor).secret
    usage_only = make_key(account=poor, scopes=["usage"]).secret
    url = gateway_server.url + "/v1/chat/completions"

    def post(secret: str | None, body: dict) -> int:
        headers = {"Authorization": f"Bearer {secret}"} if secret else {}
        return httpx.post(url, json=body, headers=headers, timeout=30).status_code

    assert post(broke, {"model": "acme/model-1", "messages": HELLO}) == 402
    assert post(broke, {"model": "acme/model-1", "messages": HELLO}) == 402
    assert post(usage_only, {"model": "acme/model-1", "messages": HELLO}) == 403
    assert post(broke, {"model": "acme/model-1", "messages": []}) == 400  # refused before its key is looked at
    assert post("sk-si-unknown-key", {"model": "acme/model-1", "messages": HELLO}) == 401
    assert UsageRecord.objects.count() == 0  # a refusal is never charged and has no usage record

    client = Client()
    assert client.login(username="poor@example.com", password=PASSWORD)
    deadline = time.monotonic() + 10
    while True:
        html = client.get("/dashboard/").content.decode()
        if 'data-code="invalid_request"' in html or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    table = html[html.index('id="refused-table"') :]
    counts = dict(re.findall(r'data-code="([a-z_]+)">.*?data-label="Requests">([\d,]+)<', table, re.S))
    assert counts == {"insufficient_credits": "2", "insufficient_scope": "1", "invalid_request": "1"}
    assert "402" in table and "403" in table
    # The unknown key's 401 is no one's: the other account sees nothing.
    assert refusals.refusal_counts(account_id=make_account().pk, start=_today(), end=_today()) == []
    assert "Refused requests" in client.get("/dashboard/usage/").content.decode()


def _today():
    from django.utils import timezone

    return timezone.now().date()


def test_refusal_counting_is_only_for_known_keys_and_not_after_a_worker():
    from core.outcome import RequestOutcome

    known = RequestOutcome(request_id="r", account_id=1, status=402, error_code="insufficient_credits")
    unknown = RequestOutcome(request_id="r", status=401, error_code="invalid_api_key")
    at_worker = RequestOutcome(request_id="r", account_id=1, status=400, error_code="invalid_request", worker_id="w")
    served = RequestOutcome(request_id="r", account_id=1, status=200)
    assert refusals.is_refusal(known)
    assert not any(refusals.is_refusal(o) for o in (unknown, at_worker, served))


# 5. The lockout says how long, in words.
def test_lockout_says_how_long_in_words(django_user_model):
    assert duration_words(timedelta(minutes=15)) == "15 minutes"
    assert duration_words(timedelta(hours=1)) == "1 hour"
    assert duration_words(timedelta(seconds=6)) == "6 seconds"
    django_user_model.objects.create_user(username="victim@example.com", password=PASSWORD)
    client = Client()
    for _ in range(30):
        client.post("/accounts/login/", {"username": "victim@example.com", "password": "wrong"})
    page = client.post("/accounts/login/", {"username": "victim@example.com", "password": PASSWORD})
    assert page.status_code == 429
    assert "Try again in 15 minutes" in page.content.decode() and "PT15M" not in page.content.decode()


# 6. One number rule: credits for people 2..6 decimals grouped, token counts grouped.
def test_numbers_read_one_way(owner, owner_account):
    from billing.services import credits_reserve, reservation_settle
    from core.outcome import RequestOutcome

    assert [display_credits(m) for m in (10, 1_500_000, 1_234_567_000_000)] == ["0.00001", "1.50", "1,234,567.00"]
    assert tokens(1234567) == "1,234,567"
    model = make_model(model_id="acme/big", input_price=1, output_price=1)
    reservation = credits_reserve(account_id=owner_account.pk, amount=MICRO, model=model, request_id="big")
    reservation_settle(
        reservation_id=reservation.pk,
        prompt_tokens=123_456,
        completion_tokens=7_890,
        outcome=RequestOutcome(request_id="big", worker_id="w", latency=1.2346),
    )
    home = owner.get("/dashboard/").content.decode()
    assert "123,456" in home and "7,890" in home and "1,235 ms" in home
    assert 'id="tokens-today">131,346<' in home
    usage = owner.get("/dashboard/usage/").content.decode()
    assert "123,456" in usage
    charts = (Path(settings.BASE_DIR) / "static" / "js" / "charts.js").read_text()
    assert "precision: 0" in charts  # the token axis counts whole tokens


# 8. A refused key form says why, at the top, and the page opens there.
def test_key_form_errors_are_on_top_and_name_the_scopes(owner):
    page = owner.post("/dashboard/keys/", {"name": "none"})
    html = page.content.decode()
    assert page.status_code == 400
    assert 'action="/dashboard/keys/#create-key"' in html
    errors = html.index('id="key-form-errors"')
    assert errors < html.index('name="name"')
    assert "Choose at least one scope." in html[errors : html.index('name="name"')]
    assert "This field is required" not in html


# 9. The key's budget on the created page, in key.create, and readable once cleared.
def test_key_budget_is_shown_and_audited_readably(owner, owner_account, staff):
    response = owner.post("/dashboard/keys/", {"name": "ci", "scopes": ["chat"], "budget": "5"})
    assert response.status_code == 302
    created = owner.get(response["Location"]).content.decode()
    assert '<span id="created-budget">5.00 credits</span>' in created
    key = ApiKey.objects.get(name="ci")
    assert AuditLog.objects.get(action="key.create", target_id=str(key.pk)).detail["budget"] == (
        "5.000000 credits a month"
    )
    owner.post(f"/dashboard/keys/{key.pk}/budget/", {"budget": ""})
    assert AuditLog.objects.get(action="key.budget", target_id=str(key.pk)).detail["budget"] == "none"
    audit = staff.get("/admin/core/auditlog/").content.decode()
    assert "null" not in audit and "budget:</span> none" in audit


# 10. The admin: seconds, readable headers and counts, runtime labels.
def test_admin_reads_well(staff, owner_account):
    from workers.models import Worker

    make_key(account=owner_account, name="a", actor="ops")
    make_key(account=owner_account, name="b", actor="ops")
    audit = staff.get("/admin/core/auditlog/").content.decode()
    assert "Target repr" not in audit and ">Target<" in audit
    assert "audit log entries" in audit
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", audit)
    assert dict(Worker.Runtime.choices) == {"triton": "Triton", "tensorrt-llm": "TensorRT-LLM", "cuda": "CUDA"}
    workers = staff.get("/admin/workers/worker/").content.decode()
    assert "TensorRT-LLM" in workers and "Tensorrt" not in workers


# 12. The /v1 reference stands on its own and works offline.
def test_v1_reference_lists_its_codes_and_loads_nothing_from_outside(client, db):
    document = client.get("/docs/v1.json").json()
    description = document["info"]["description"]
    assert "CONTRACT" not in description
    for code in ("invalid_request", "invalid_api_key", "insufficient_credits", "key_budget_exceeded", "overloaded"):
        assert f"`{code}`" in description
    page = client.get("/docs/v1/").content.decode()
    assert "img-src 'self' data:" in page and 'spec.info.version = ""' in page
    assert "cdn." not in page


# 13. The staff API refuses a browser with a page that offers a sign-in, and its schema as JSON.
def test_staff_api_refuses_browsers_with_a_sign_in_page(client, owner):
    browser = {"HTTP_ACCEPT": "text/html,application/xhtml+xml,*/*;q=0.8"}
    for path in ("/api/workers/", "/api/schema/", "/api/docs/"):
        page = client.get(path, **browser)
        assert page.status_code == 401 and page["Content-Type"].startswith("text/html"), path
        assert f'href="/admin/login/?next={path.replace("/", "%2F")}"' in page.content.decode(), path
    denied = owner.get("/api/workers/", **browser)
    assert denied.status_code == 403 and "not staff" in denied.content.decode()
    schema = client.get("/api/schema/", HTTP_ACCEPT="*/*")
    assert schema.status_code == 401 and schema["Content-Type"] == "application/json"
    assert schema.json()["error"]["code"] == "not_authenticated" and "Content-Disposition" not in schema
