"""A real browser (Debian's chromium, driven by Playwright) on the real ASGI app.

The customer signs in, sees the balance and a drawn chart, creates a key, and
with that key makes a real request through the gateway to the worker
simulator; the settled usage row appears on the open page over the WebSocket.
Staff pages are visited too. Screenshots go to var/screenshots/.
"""

from __future__ import annotations

import os
import uuid
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from accounts.models import ApiKey
from accounts.services import account_user_create
from billing.models import UsageRecord
from billing.services import credits_reserve, reservation_settle
from core.credits import MICRO, display_credits
from core.outcome import RequestOutcome
from tests.factories import make_account, make_model
from tests.servers import register_worker

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = Path(django_settings.BASE_DIR) / "var" / "screenshots"
PASSWORD = "correct horse battery staple"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fresh_gateway"),
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium (make chromium)"),
]


def seed_history(account, model) -> None:
    """A few settled requests over the last days, so the charts have bars."""
    for days_ago in range(6):
        reservation = credits_reserve(
            account_id=account.pk, amount=MICRO // 10, model=model, request_id=f"old-{days_ago}"
        )
        record = reservation_settle(
            reservation_id=reservation.pk,
            prompt_tokens=200 * (days_ago + 1),
            completion_tokens=100 * (days_ago + 1),
            outcome=RequestOutcome(request_id="", worker_id="sim-1", latency=(40 + days_ago) / 1000),
        )
        assert record is not None
        UsageRecord.objects.filter(pk=record.pk).update(created_at=timezone.now() - timedelta(days=days_ago))


def canvas_has_pixels(page, selector: str) -> bool:
    return page.eval_on_selector(
        selector,
        """(canvas) => {
            const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
            for (let i = 3; i < data.length; i += 4) { if (data[i] !== 0) return true; }
            return false;
        }""",
    )


def test_customer_dashboard_in_a_real_browser(gateway_server, simulator, settings, django_user_model, monkeypatch):
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop in this thread; the ORM calls here are plain sync code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    # Plain http on 127.0.0.1 in the test: cookies must not require TLS.
    settings.SESSION_COOKIE_SECURE = False
    settings.CSRF_COOKIE_SECURE = False
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    model = make_model(model_id="acme/model-1", input_price=MICRO, output_price=2 * MICRO, max_output_tokens=64)
    account = make_account(name="Browser Co", credits=25)
    account_user_create(account=account, email="owner@browser.example", password=PASSWORD)
    django_user_model.objects.create_superuser(username="admin", email="admin@browser.example", password=PASSWORD)
    register_worker(simulator.base_url)
    seed_history(account, model)
    account.refresh_from_db()
    base = gateway_server.url

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        try:
            page.goto(f"{base}/dashboard/")
            assert "/accounts/login/" in page.url
            page.screenshot(path=str(SCREENSHOTS / "01-login.png"), full_page=True)
            page.fill("#id_username", "owner@browser.example")
            page.fill("#id_password", PASSWORD)
            page.click("button[type=submit]")
            page.wait_for_url(f"{base}/dashboard/")
            balance = page.text_content("#balance")
            assert balance is not None and balance.strip() == display_credits(account.available)
            page.screenshot(path=str(SCREENSHOTS / "02-home.png"), full_page=True)

            page.goto(f"{base}/dashboard/usage/")
            page.wait_for_function("() => window.Chart && Chart.getChart('tokens-chart')")
            assert canvas_has_pixels(page, "#tokens-chart") and canvas_has_pixels(page, "#cost-chart")
            page.screenshot(path=str(SCREENSHOTS / "03-usage.png"), full_page=True)

            page.goto(f"{base}/dashboard/keys/")
            page.fill("#id_name", "browser-key")
            page.fill("#id_budget", "1")  # a 1-credit monthly budget
            page.click("button.primary")
            page.wait_for_selector("#secret")
            secret = page.input_value("#secret")
            assert secret.startswith("sk-si-")
            assert ApiKey.objects.get(account=account, name="browser-key").monthly_budget == MICRO
            page.screenshot(path=str(SCREENSHOTS / "04-key-created.png"), full_page=True)
            # Reloading the page neither shows the secret again nor creates a second key.
            page.reload()
            assert page.locator("#secret").count() == 0 and "shown once" in page.content()
            assert ApiKey.objects.filter(account=account, name="browser-key").count() == 1
            page.screenshot(path=str(SCREENSHOTS / "04b-key-created-reloaded.png"), full_page=True)

            page.goto(f"{base}/dashboard/usage/")
            page.wait_for_selector("#live-status:not([hidden])")  # the WebSocket is open
            before = page.locator("#recent-rows tr").count()
            request_id = f"browser-{uuid.uuid4().hex[:12]}"
            response = httpx.post(
                f"{base}/v1/chat/completions",
                headers={"Authorization": f"Bearer {secret}", "X-Request-Id": request_id},
                json={"model": "acme/model-1", "messages": [{"role": "user", "content": "hello there"}]},
                timeout=30,
            )
            assert response.status_code == 200, response.text
            rid = response.headers.get("x-request-id") or request_id
            row = page.wait_for_selector(f'#recent-rows tr[data-request-id="{rid}"]', timeout=10_000)
            assert row is not None and "acme/model-1" in (row.text_content() or "")
            assert page.locator("#recent-rows tr").count() == before + 1
            page.screenshot(path=str(SCREENSHOTS / "05-live-row.png"), full_page=True)

            # The overview cards are live too: today's count moves without a reload.
            page.goto(f"{base}/dashboard/")
            page.wait_for_selector("#live-status:not([hidden])")
            today = int((page.text_content("#requests-today") or "0").strip())
            response = httpx.post(
                f"{base}/v1/chat/completions",
                headers={"Authorization": f"Bearer {secret}"},
                json={"model": "acme/model-1", "messages": [{"role": "user", "content": "and again"}]},
                timeout=30,
            )
            assert response.status_code == 200, response.text
            page.wait_for_function(
                f"() => document.getElementById('requests-today').textContent.trim() === '{today + 1}'",
                timeout=10_000,
            )

            # Budgets: the key's spend shows on the keys page; a budget below the next hold refuses it.
            page.goto(f"{base}/dashboard/keys/")
            key_row = page.locator('tr[data-key^="sk-si-"]', has_text="browser-key")
            spent = sum(UsageRecord.objects.filter(api_key__name="browser-key").values_list("cost", flat=True))
            assert display_credits(spent) in (key_row.text_content() or "")
            key_row.locator("input[name=budget]").fill("0.0001")
            key_row.locator(".budget-form button").click()
            page.wait_for_selector(".messages li")
            assert "0.0001 credits a month" in (page.text_content(".messages") or "")
            refused = httpx.post(
                f"{base}/v1/chat/completions",
                headers={"Authorization": f"Bearer {secret}"},
                json={"model": "acme/model-1", "messages": [{"role": "user", "content": "hello again"}]},
                timeout=30,
            )
            assert refused.status_code == 402 and refused.json()["error"]["code"] == "key_budget_exceeded"
            page.screenshot(path=str(SCREENSHOTS / "05b-keys-budget.png"), full_page=True)
            # Revoke asks first; dismissing keeps the key.
            page.once("dialog", lambda dialog: dialog.dismiss())
            key_row.locator("button.danger").click()
            assert ApiKey.objects.get(account=account, name="browser-key").revoked_at is None

            # The models page: prices per 1M tokens, and up (the simulator serves acme/model-1).
            page.goto(f"{base}/dashboard/models/")
            model_row = page.locator('tr[data-model="acme/model-1"]')
            text = model_row.text_content() or ""
            assert "up" in text and "1.00" in text and "2.00" in text and "64" in text
            page.screenshot(path=str(SCREENSHOTS / "05c-models.png"), full_page=True)

            page.set_viewport_size({"width": 390, "height": 844})  # a phone
            page.goto(f"{base}/dashboard/")
            page.screenshot(path=str(SCREENSHOTS / "06-home-phone.png"), full_page=True)
            page.goto(f"{base}/dashboard/keys/")
            # The page itself does not scroll sideways; each key is a card of labelled rows,
            # and each key's status and Revoke button are on screen.
            assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
            revoke = page.locator("tr", has_text="browser-key").locator("button.danger").bounding_box()
            status = page.locator("tr", has_text="browser-key").locator(".badge").bounding_box()
            assert revoke is not None and status is not None
            assert revoke["x"] + revoke["width"] <= 390 and status["x"] + status["width"] <= 390
            page.screenshot(path=str(SCREENSHOTS / "06b-keys-phone.png"), full_page=True)

            staff = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            staff.goto(f"{base}/admin/")
            staff.fill("#id_username", "admin")
            staff.fill("#id_password", PASSWORD)
            staff.click("input[type=submit]")
            staff.goto(f"{base}/admin/accounts/account/")
            assert "Browser Co" in staff.content()
            staff.screenshot(path=str(SCREENSHOTS / "07-admin-accounts.png"), full_page=True)
            staff.goto(f"{base}/admin/accounts/account/{account.pk}/grant/")
            staff.screenshot(path=str(SCREENSHOTS / "08-admin-grant.png"), full_page=True)
            staff.goto(f"{base}/admin/billing/usagerecord/")
            staff.screenshot(path=str(SCREENSHOTS / "09-admin-usage.png"), full_page=True)
            # At 1280 px the cost and latency columns are on screen.
            cost = staff.locator("th.column-cost_credits").bounding_box()
            latency = staff.locator("th.column-latency_ms").bounding_box()
            assert cost is not None and latency is not None and latency["x"] + latency["width"] <= 1280
            staff.goto(f"{base}/admin/accounts/apikey/?state=active")
            assert "browser-key" in staff.content()
            staff.screenshot(path=str(SCREENSHOTS / "10-admin-keys.png"), full_page=True)
        finally:
            browser.close()


# Visible means: laid out, and inside the viewport and every ancestor that clips (overflow).
VISIBLE_JS = """(el) => {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) return false;
    if (r.left < -0.5 || r.right > window.innerWidth + 0.5) return false;
    for (let a = el.parentElement; a; a = a.parentElement) {
        const style = getComputedStyle(a);
        if (style.display === "none" || style.visibility === "hidden") return false;
        if (style.overflowX !== "visible") {
            const b = a.getBoundingClientRect();
            if (r.left < b.left - 0.5 || r.right > b.right + 0.5) return false;
        }
    }
    return true;
}"""


def assert_visible(page, selector: str, *, within: str | None = None) -> None:
    locator = page.locator(selector).first
    assert locator.count(), f"{selector} is not on {page.url}"
    assert locator.evaluate(VISIBLE_JS), f"{selector} is not visible at {page.viewport_size['width']} px on {page.url}"
    if within:
        inner = locator.bounding_box()
        outer = page.locator(within).first.bounding_box()
        assert inner and outer and inner["x"] + inner["width"] <= outer["x"] + outer["width"] + 0.5, (selector, within)


def test_first_day_layouts_at_1280_and_390(
    gateway_server, simulator, settings, django_user_model, monkeypatch, tmp_path
):
    """Issue 21 items 1, 3 and 11: the buttons, columns and headings a first day could not see."""
    from playwright.sync_api import sync_playwright

    from core.audit import audit_record

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    settings.SESSION_COOKIE_SECURE = False
    settings.CSRF_COOKIE_SECURE = False
    shots = tmp_path / "screenshots"
    shots.mkdir()

    model = make_model(model_id="acme/model-1", input_price=MICRO, output_price=2 * MICRO, max_output_tokens=64)
    account = make_account(name="Layout Co", credits=25)
    account_user_create(account=account, email="owner@layout.example", password=PASSWORD)
    django_user_model.objects.create_superuser(username="admin", email="admin@layout.example", password=PASSWORD)
    register_worker(simulator.base_url)
    seed_history(account, model)
    key = make_key_with_everything(account)
    audit_record(actor="admin", action="key.budget", target=key, detail={"via": "admin", "budget": "none"})
    base = gateway_server.url

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for width in (1280, 390):
                page = browser.new_page(viewport={"width": width, "height": 900})
                # 1. The landing page: every button whole, none on top of another.
                page.goto(f"{base}/")
                page.screenshot(path=str(shots / f"landing-{width}.png"), full_page=True)
                boxes = [b.bounding_box() for b in page.locator(".actions .button").all()]
                assert len(boxes) >= 3 and all(box and box["x"] + box["width"] <= width for box in boxes)
                for i, a in enumerate(boxes):
                    for b in boxes[i + 1 :]:
                        assert a and b
                        apart_x = a["x"] + a["width"] <= b["x"] or b["x"] + b["width"] <= a["x"]
                        apart_y = a["y"] + a["height"] <= b["y"] or b["y"] + b["height"] <= a["y"]
                        assert apart_x or apart_y, (width, a, b)
                primary = page.locator(".button.primary").first
                assert primary.evaluate("(el) => getComputedStyle(el).color") == "rgb(255, 255, 255)"
                page.click("text=Models and prices")
                page.wait_for_url(f"{base}/models/")
                for label in ("Model", "Status", "Input / 1M tokens", "Output / 1M tokens", "Max output tokens"):
                    assert_visible(page, f'tr[data-model="acme/model-1"] td[data-label="{label}"]')
                page.screenshot(path=str(shots / f"prices-{width}.png"), full_page=True)

                page.goto(f"{base}/accounts/login/")
                page.fill("#id_username", "owner@layout.example")
                page.fill("#id_password", PASSWORD)
                page.click("button[type=submit]")
                page.wait_for_url(f"{base}/dashboard/")
                assert page.evaluate("() => document.documentElement.scrollWidth") <= width
                for label in ("Time (UTC)", "Model", "Status", "Prompt", "Completion", "Cost", "Latency"):
                    assert_visible(page, f'#recent-rows tr td[data-label="{label}"]')
                page.screenshot(path=str(shots / f"home-{width}.png"), full_page=True)

                # 3 and 11. The keys table fits its card; on a phone every column is on screen.
                page.goto(f"{base}/dashboard/keys/")
                page.screenshot(path=str(shots / f"keys-{width}.png"), full_page=True)
                row = f'tr[data-key="{key.prefix}"]'
                for label in (
                    "Name",
                    "Status",
                    "Spent this month",
                    "Monthly budget",
                    "Access",
                    "Created",
                    "Last used",
                    "Expires",
                ):
                    assert_visible(page, f'{row} td[data-label="{label}"]', within=".keys-table")
                assert_visible(page, f"{row} button.danger")
                assert page.evaluate("() => document.documentElement.scrollWidth") <= width
                if width == 1280:
                    for header in ("Last used", "Expires"):
                        assert_visible(page, f'.keys-table th:text-is("{header}")', within="section.card")
                    table = page.locator(".keys-table").bounding_box()
                    card = page.locator("section.card").first.bounding_box()
                    assert table and card and table["width"] <= card["width"]

                page.goto(f"{base}/dashboard/usage/")
                for date in page.locator("h2 .nowrap").all():  # a heading never breaks inside a date
                    assert date.evaluate("(el) => el.getClientRects().length") == 1
                for label in ("Model", "Requests", "Prompt tokens", "Completion tokens", "Cost (credits)"):
                    assert_visible(page, f'#per-model-table td[data-label="{label}"]')
                assert page.evaluate("() => document.documentElement.scrollWidth") <= width
                page.screenshot(path=str(shots / f"usage-{width}.png"), full_page=True)
                page.close()

            # 3. Admin lists at 1280 px: the columns that were cut off are on screen.
            staff = browser.new_page(viewport={"width": 1280, "height": 900})
            staff.goto(f"{base}/admin/login/")
            staff.fill("#id_username", "admin")
            staff.fill("#id_password", PASSWORD)
            staff.click("input[type=submit]")
            columns = {
                "accounts/apikey": ("state", "last_used_at", "expires_at"),
                "workers/worker": ("load", "last_probe_at", "last_probe_latency_ms"),
                "billing/usagerecord": ("prompt_tokens", "completion_tokens", "latency_ms", "worker_id", "request_id"),
                "billing/reservation": ("closed_at", "request_id"),
                "core/auditlog": ("target_repr", "detail_summary"),
            }
            for path, names in columns.items():
                staff.goto(f"{base}/admin/{path}/")
                staff.screenshot(path=str(shots / f"admin-{path.replace('/', '-')}-1280.png"), full_page=True)
                for name in names:
                    assert_visible(staff, f"#result_list th.column-{name}")
                    assert_visible(staff, f"#result_list td.field-{name}, #result_list th.field-{name}")
        finally:
            browser.close()
    print(f"screenshots in {shots}")


def make_key_with_everything(account):
    """A key with every column filled: name, budget, scopes, models, used, expiring."""
    from tests.factories import make_key

    created = make_key(
        account=account,
        name="production-backend",
        monthly_budget=5 * MICRO,
        allowed_models=["acme/model-1"],
        expires_at=timezone.now() + timedelta(days=90),
        actor="admin",
    )
    ApiKey.objects.filter(pk=created.api_key.pk).update(last_used_at=timezone.now() - timedelta(minutes=3))
    return created.api_key
