"""Issue 21's persona walk in a real browser: every dashboard page as owner, developer and viewer,
and the admin's list pages as staff, each at 1280 px and at 390 px (a phone).

On every page: what the role may see is there and what it may not is neither linked nor served
(a 403 page instead), the columns issue 21 names (items 3 and 11) are on screen, the page never
scrolls sideways and no two buttons sit on top of each other. One browser, one live server, one
tab per persona that is resized rather than reopened. Screenshots go to the test's tmp dir.
"""

from __future__ import annotations

import os

import pytest

from accounts.services import account_user_create, invitation_create
from alerts.services import alert_settings_set, alerts_check
from core.credits import MICRO
from tests.factories import make_account, make_member, make_model
from tests.servers import register_worker
from tests.test_browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    PASSWORD,
    assert_visible,
    make_key_with_everything,
    seed_history,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fresh_gateway"),
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium (make chromium)"),
]

WIDTHS = (1280, 390)
PAGES = {  # dashboard page -> its path and its nav link text
    "home": ("/dashboard/", "Overview"),
    "usage": ("/dashboard/usage/", "Usage"),
    "keys": ("/dashboard/keys/", "API keys"),
    "models": ("/dashboard/models/", "Models"),
    "members": ("/dashboard/members/", "Members"),
    "alerts": ("/dashboard/alerts/", "Alerts"),
}
ALLOWED = {
    "owner": {"home", "usage", "keys", "models", "members", "alerts"},
    "developer": {"home", "usage", "keys", "models"},
    "viewer": {"home", "usage", "models"},
}
EMAILS = {"owner": "owner@walk.example", "developer": "dev@walk.example", "viewer": "viewer@walk.example"}
KEY_COLUMNS = ("Name", "Status", "Spent this month", "Monthly budget", "Access", "Created", "Last used", "Expires")
RECENT_COLUMNS = ("Time (UTC)", "Model", "Status", "Prompt", "Completion", "Cost", "Latency")
PER_MODEL_COLUMNS = ("Model", "Requests", "Prompt tokens", "Completion tokens", "Cost (credits)")
PRICE_COLUMNS = ("Model", "Status", "Input / 1M tokens", "Output / 1M tokens", "Max output tokens")
# Admin list pages and the columns of each that issue 21 item 3 found cut off at 1280 px.
ADMIN_LISTS = {
    "accounts/account": ("name", "balance", "key_count"),
    "accounts/apikey": ("state", "last_used_at", "expires_at"),
    "accounts/invitation": ("email", "role", "state"),
    "workers/worker": ("load", "last_probe_at", "last_probe_latency_ms"),
    "catalog/publicmodel": ("model_id", "max_output_tokens", "enabled"),
    "billing/ledgerentry": ("kind", "amount_credits"),
    "billing/usagerecord": ("prompt_tokens", "completion_tokens", "latency_ms", "worker_id", "request_id"),
    "billing/reservation": ("closed_at", "request_id"),
    "core/auditlog": ("target_repr", "detail_summary"),
    "alerts/alertsettings": ("account", "webhook_url"),
    "alerts/alertdelivery": ("status", "attempts"),
}

# Visible buttons (and nav links, and links styled as buttons) whose boxes intersect: pairs of labels.
OVERLAPS_JS = """() => {
    const els = [...document.querySelectorAll("button, .button, input[type=submit], .nav a")].filter((el) => {
        const r = el.getBoundingClientRect();
        return r.width > 0 && r.height > 0 && getComputedStyle(el).visibility !== "hidden";
    });
    const hits = [];
    for (let i = 0; i < els.length; i++) {
        const a = els[i].getBoundingClientRect();
        for (let j = i + 1; j < els.length; j++) {
            const b = els[j].getBoundingClientRect();
            const apart = a.right <= b.left + 0.5 || b.right <= a.left + 0.5
                || a.bottom <= b.top + 0.5 || b.bottom <= a.top + 0.5;
            if (!apart) hits.push([els[i].textContent.trim(), els[j].textContent.trim()]);
        }
    }
    return hits;
}"""


def assert_fits(page, what: str) -> None:
    """No sideways scroll of the page, and no button on top of another."""
    width = page.evaluate("() => window.innerWidth")
    scroll = page.evaluate("() => document.documentElement.scrollWidth")
    assert scroll <= width, f"{what}: the page is {scroll} px wide at {width} px"
    assert page.evaluate(OVERLAPS_JS) == [], f"{what}: buttons overlap at {width} px"


def sign_in(page, base: str, email: str) -> None:
    page.goto(f"{base}/accounts/login/")
    page.fill("#id_username", email)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/dashboard/")


def check_page(page, *, role: str, name: str, key_prefix: str) -> None:
    """The assertions for one allowed dashboard page, at the page's current width."""
    width = page.viewport_size["width"]
    if name == "home":
        for label in RECENT_COLUMNS:
            assert_visible(page, f'#recent-rows tr td[data-label="{label}"]')
        assert_visible(page, "#balance")
    elif name == "usage":
        for label in PER_MODEL_COLUMNS:
            assert_visible(page, f'#per-model-table td[data-label="{label}"]')
        for label in RECENT_COLUMNS:
            assert_visible(page, f'#recent-rows tr td[data-label="{label}"]')
        for date in page.locator("h2 .nowrap").all():  # a heading never breaks inside a date
            assert date.evaluate("(el) => el.getClientRects().length") == 1
    elif name == "keys":
        row = f'tr[data-key="{key_prefix}"]'
        for label in KEY_COLUMNS:
            assert_visible(page, f'{row} td[data-label="{label}"]', within=".keys-table")
        assert_visible(page, f"{row} button.danger")
        if width == 1280:
            for header in KEY_COLUMNS:
                assert_visible(page, f'.keys-table th:text-is("{header}")', within="section.card")
        # Budgets are the owner's: the per-key form and the create form's field.
        budget_forms = page.locator(f"{row} .budget-form").count()
        budget_field = page.locator("#id_budget").count()
        if role == "owner":
            assert budget_forms == 1 and budget_field == 1
            assert_visible(page, f"{row} .budget-form input[name=budget]")
            assert_visible(page, f"{row} .budget-form button")
        else:
            assert budget_forms == 0 and budget_field == 0
            assert "5" in (page.locator(f'{row} td[data-label="Monthly budget"]').text_content() or "")
        assert_visible(page, "#create-key button.primary")
    elif name == "models":
        for label in PRICE_COLUMNS:
            assert_visible(page, f'tr[data-model="acme/model-1"] td[data-label="{label}"]')
    elif name == "members":
        for email in EMAILS.values():
            member = f'tr[data-member="{email}"]'
            for label in ("Email", "Role", "Member since"):
                assert_visible(page, f'{member} td[data-label="{label}"]')
            assert_visible(page, f"{member} select[name=role]")
            assert_visible(page, f"{member} button.danger")
        for label in ("Email", "Role", "Invited by", "Expires"):
            assert_visible(page, f'tr[data-invitation="later@walk.example"] td[data-label="{label}"]')
        assert_visible(page, 'tr[data-invitation="later@walk.example"] button')
        assert_visible(page, ".invite-form button.primary")
    elif name == "alerts":
        for label in ("Time", "Alert", "Sent to", "Status", "Attempts", "Last result"):
            assert_visible(page, f'#alerts-table td[data-label="{label}"]')
        assert_visible(page, ".alert-form button.primary")
        for field in page.locator(".alert-form input:not([type=hidden]):not([type=checkbox])").all():
            assert field.evaluate("(el) => el.getBoundingClientRect().right <= window.innerWidth + 0.5")


def test_every_page_as_owner_developer_viewer_and_staff_at_1280_and_390(
    gateway_server, simulator, settings, django_user_model, monkeypatch, tmp_path
):
    from playwright.sync_api import sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    settings.SESSION_COOKIE_SECURE = False
    settings.CSRF_COOKIE_SECURE = False
    # Four sign-ins: the production hasher's rounds would be most of the test's time.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    shots = tmp_path / "screenshots"
    shots.mkdir()

    model = make_model(model_id="acme/model-1", input_price=MICRO, output_price=2 * MICRO, max_output_tokens=64)
    account = make_account(name="Walk Co", credits=25)
    account_user_create(account=account, email=EMAILS["owner"], password=PASSWORD)
    make_member(account=account, email=EMAILS["developer"], role="developer", password=PASSWORD)
    make_member(account=account, email=EMAILS["viewer"], role="viewer", password=PASSWORD)
    django_user_model.objects.create_superuser(username="admin", email="admin@walk.example", password=PASSWORD)
    register_worker(simulator.base_url)
    seed_history(account, model)
    key = make_key_with_everything(account)
    invitation_create(account=account, email="later@walk.example", role="viewer")
    # A low-balance alert raised (not sent): a row on the alerts page and in the admin's delivery log.
    alert_settings_set(account=account, low_balance=30 * MICRO)
    assert alerts_check()
    base = gateway_server.url

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            # The landing page, signed out: every button whole and apart.
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            for width in WIDTHS:
                page.set_viewport_size({"width": width, "height": 900})
                page.goto(f"{base}/")
                boxes = page.locator(".actions .button").all()
                assert len(boxes) >= 3
                for box in boxes:
                    assert_visible(page, f'.actions .button:text-is("{(box.text_content() or "").strip()}")')
                assert_fits(page, f"landing at {width}")
                page.screenshot(path=str(shots / f"landing-{width}.png"), full_page=True)
            page.close()

            for role, allowed in ALLOWED.items():
                page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
                sign_in(page, base, EMAILS[role])
                for width in WIDTHS:
                    page.set_viewport_size({"width": width, "height": 900})
                    for name, (path, _link) in PAGES.items():
                        response = page.goto(f"{base}{path}")
                        assert response is not None
                        what = f"{role} on {path} at {width}"
                        page.screenshot(path=str(shots / f"{role}-{name}-{width}.png"), full_page=True)
                        links = {text.strip() for text in page.locator(".nav a").all_text_contents()}
                        assert {PAGES[n][1] for n in allowed} <= links, what
                        assert not {PAGES[n][1] for n in set(PAGES) - allowed} & links, what
                        assert f"· {role}" in (page.text_content(".who") or ""), what
                        if name in allowed:
                            assert response.status == 200, what
                            check_page(page, role=role, name=name, key_prefix=key.prefix)
                        else:
                            assert response.status == 403, what
                            assert "Not allowed for your role" in (page.text_content("h1") or ""), what
                            assert_visible(page, 'a:text-is("Back to the overview")')
                        assert_fits(page, what)

                    if "keys" in allowed:
                        # The key-created page: the secret and its Copy button on screen.
                        page.goto(f"{base}/dashboard/keys/")
                        page.fill("#id_name", f"{role}-{width}")
                        page.click("#create-key button.primary")
                        # The form posts to its #create-key anchor; the browser keeps it across the redirect.
                        page.wait_for_url(lambda url: "/dashboard/keys/created/" in url)
                        assert page.input_value("#secret").startswith("sk-si-")
                        assert_visible(page, "#secret")
                        assert_visible(page, "button[data-copy]")
                        assert_fits(page, f"{role} on the key-created page at {width}")
                        page.screenshot(path=str(shots / f"{role}-key-created-{width}.png"), full_page=True)
                    else:
                        # Neither linked nor served.
                        response = page.goto(f"{base}/dashboard/keys/created/")
                        assert response is not None and response.status == 403
                page.context.close()

            # Staff: no customer account, so the dashboard is the "no account" page; the admin's lists fit.
            staff = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            staff.goto(f"{base}/admin/login/")
            staff.fill("#id_username", "admin")
            staff.fill("#id_password", PASSWORD)
            staff.click("input[type=submit]")
            staff.wait_for_url(f"{base}/admin/")
            for width in WIDTHS:
                staff.set_viewport_size({"width": width, "height": 900})
                response = staff.goto(f"{base}/dashboard/")
                assert response is not None and response.status == 403
                assert_visible(staff, 'a:text-is("Go to the admin")')
                assert_fits(staff, f"staff on /dashboard/ at {width}")
                for path, columns in ADMIN_LISTS.items():
                    response = staff.goto(f"{base}/admin/{path}/")
                    assert response is not None and response.status == 200, path
                    what = f"staff on /admin/{path}/ at {width}"
                    staff.screenshot(path=str(shots / f"staff-{path.replace('/', '-')}-{width}.png"), full_page=True)
                    assert staff.locator("#result_list tbody tr").count() >= 1, what
                    if width == 1280:  # on a phone the list scrolls inside its own box, as Django's admin does
                        for column in columns:
                            assert_visible(staff, f"#result_list th.column-{column}")
                            assert_visible(staff, f"#result_list td.field-{column}, #result_list th.field-{column}")
                    assert_fits(staff, what)
        finally:
            browser.close()
    print(f"screenshots in {shots}")
