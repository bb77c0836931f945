"""Security behaviours: the live feed's origin check, sign-in throttling, password reset,
the plain-HTTP sign-in message and staff's per-account key ceilings."""

from __future__ import annotations

import re
from io import StringIO

import httpx
import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.core import mail
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from accounts.models import ApiKey
from accounts.selectors import api_key_authenticate
from accounts.services import account_ceilings_set, account_user_create
from speedinfer.asgi import application
from tests.factories import make_account, make_key, make_model
from tests.servers import register_worker

PASSWORD = "correct horse battery staple"


def signed_in_cookie(email: str) -> bytes:
    client = Client()
    assert client.login(username=email, password=PASSWORD)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def handshake(cookie: bytes, origin: bytes | None, host: bytes = b"dash.example.com") -> bool:
    headers = [(b"cookie", cookie), (b"host", host)]
    if origin is not None:
        headers.append((b"origin", origin))

    async def attempt() -> bool:
        communicator = WebsocketCommunicator(application, "/ws/usage/", headers=headers)
        connected, _ = await communicator.connect(timeout=5)
        await communicator.disconnect()
        return bool(connected)

    return async_to_sync(attempt)()


@pytest.mark.django_db(transaction=True)
def test_the_live_feed_refuses_another_sites_origin_even_with_allowed_hosts_star(settings):
    settings.ALLOWED_HOSTS = ["*"]
    settings.SPEEDINFER_WS_ALLOWED_ORIGINS = []
    account_user_create(account=make_account(name="ws-origin"), email="ws@example.com", password=PASSWORD)
    cookie = signed_in_cookie("ws@example.com")
    assert handshake(cookie, b"https://dash.example.com")  # same origin
    assert not handshake(cookie, b"https://evil.example")
    assert not handshake(cookie, b"https://dash.example.com.evil.example")
    assert not handshake(cookie, b"null")
    settings.SPEEDINFER_WS_ALLOWED_ORIGINS = ["https://ops.example.org"]
    assert handshake(cookie, b"https://ops.example.org")
    assert not handshake(cookie, b"http://ops.example.org")  # the scheme is part of the origin
    assert not handshake(cookie, b"https://evil.example")


@pytest.mark.django_db
@pytest.mark.parametrize("login_url", ["/accounts/login/", "/admin/login/"])
def test_thirty_wrong_passwords_lock_the_sign_in_even_for_the_right_one(django_user_model, login_url):
    django_user_model.objects.create_user(username="victim@example.com", password=PASSWORD, is_staff=True)
    client = Client()
    for _ in range(30):
        client.post(login_url, {"username": "victim@example.com", "password": "wrong"})
    response = client.post(login_url, {"username": "victim@example.com", "password": PASSWORD})
    assert response.status_code == 429
    assert b"Too many sign-in attempts" in response.content
    assert "_auth_user_id" not in client.session
    # Another user from the same address is not locked out by it.
    django_user_model.objects.create_user(username="other@example.com", password=PASSWORD, is_staff=True)
    other = Client().post(login_url, {"username": "other@example.com", "password": PASSWORD})
    assert other.status_code == 302


@pytest.mark.django_db
def test_a_few_wrong_passwords_then_the_right_one_signs_in(django_user_model, settings):
    django_user_model.objects.create_user(username="typo@example.com", password=PASSWORD)
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert client.post("/accounts/login/", {"username": "typo@example.com", "password": "x"}).status_code == 200
    response = client.post("/accounts/login/", {"username": "typo@example.com", "password": PASSWORD})
    assert response.status_code == 302 and client.session["_auth_user_id"]


@pytest.mark.django_db
def test_password_reset_is_off_by_default():
    client = Client()
    for url in ("/accounts/password_reset/", "/accounts/password_reset/done/", "/accounts/reset/done/"):
        assert client.get(url).status_code == 404
    assert client.post("/accounts/password_reset/", {"email": "a@example.com"}).status_code == 404
    assert not mail.outbox


@pytest.mark.django_db
def test_password_reset_when_enabled_links_to_the_public_url_not_the_request_host(settings, django_user_model):
    settings.SPEEDINFER_PASSWORD_RESET = True
    settings.SPEEDINFER_PUBLIC_URL = "https://speedinfer.example.com"
    settings.ALLOWED_HOSTS = ["*"]
    django_user_model.objects.create_user(username="r@example.com", email="r@example.com", password=PASSWORD)
    response = Client().post("/accounts/password_reset/", {"email": "r@example.com"}, HTTP_HOST="attacker.example")
    assert response.status_code == 302
    (message,) = mail.outbox
    links = re.findall(r"https?://[^/\s]+", str(message.body))
    assert links and all(link == "https://speedinfer.example.com" for link in links)
    assert "attacker.example" not in message.body


@pytest.mark.django_db
def test_sign_in_over_plain_http_with_secure_cookies_says_why(settings):
    settings.CSRF_COOKIE_SECURE = True
    settings.SESSION_COOKIE_SECURE = True
    client = Client(enforce_csrf_checks=True)
    client.get("/accounts/login/")
    # A browser on http:// never sends a Secure cookie back: the POST arrives without it.
    client.cookies.clear()
    response = client.post("/accounts/login/", {"username": "a@example.com", "password": "x"})
    assert response.status_code == 403
    assert b"requires HTTPS for sign-in" in response.content
    assert b"SPEEDINFER_SECURE_COOKIES=0" in response.content


@pytest.mark.django_db
def test_key_limits_stay_under_the_accounts_ceilings():
    make_model(model_id="acme/ceil")
    account = make_account(name="ceilings")
    old = make_key(account=account, name="before-ceiling").api_key  # no limits of its own
    account_ceilings_set(account=account, rpm_ceiling=60, tpm_ceiling=10_000, actor="test")
    # The rate limiter sees min(key, ceiling), also for a key made before the ceiling.
    info = api_key_authenticate(raw_key=make_key(account=account, rpm=30).secret).key
    assert info is not None and (info.rpm, info.tpm) == (30, 10_000)
    old_info = ApiKey.objects.get(pk=old.pk)
    assert (old_info.rpm, old_info.tpm) == (None, None)

    # Dashboard: a key without limits inherits the ceilings.
    account_user_create(account=account, email="c@example.com", password=PASSWORD)
    client = Client()
    assert client.login(username="c@example.com", password=PASSWORD)
    assert (
        client.post("/dashboard/keys/", {"name": "dash", "scopes": ["chat"]}).status_code == 302
    )  # to the key-created page (post/redirect/get)
    assert ApiKey.objects.filter(name="dash").values_list("rpm", "tpm").get() == (60, 10_000)

    # createapikey: above the ceiling is refused with a clear message.
    with pytest.raises(CommandError, match="rpm: 100 is above the account's ceiling of 60"):
        call_command("createapikey", "ceilings", "--rpm", "100", stdout=StringIO())
    assert not ApiKey.objects.filter(account=account, rpm=100).exists()


@pytest.mark.django_db
def test_staff_api_refuses_a_key_above_the_ceiling():
    account = make_account(name="ceil-api")
    account_ceilings_set(account=account, rpm_ceiling=5, tpm_ceiling=None)
    admin = make_key(account=make_account(name="Staff tools"), scopes=["admin"])
    client = Client(HTTP_AUTHORIZATION=f"Bearer {admin.secret}")
    response = client.post(
        f"/api/accounts/{account.pk}/keys/", {"name": "ci", "rpm": 50}, content_type="application/json"
    )
    assert response.status_code == 400
    assert "ceiling of 5" in response.content.decode()
    ok = client.post(f"/api/accounts/{account.pk}/keys/", {"name": "ci"}, content_type="application/json")
    assert ok.status_code == 201 and ok.json()["rate_limit"]["rpm"] == 5


@pytest.mark.django_db
def test_staff_set_ceilings_on_the_admin_account_page(django_user_model):
    django_user_model.objects.create_superuser(username="admin", email="admin@example.com", password=PASSWORD)
    staff = Client()
    assert staff.login(username="admin", password=PASSWORD)
    account = make_account(name="ceil-admin")
    response = staff.post(
        f"/admin/accounts/account/{account.pk}/change/",
        {"rpm_ceiling": "7", "tpm_ceiling": "", "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0"},
    )
    assert response.status_code == 302, response.content[:2000]
    account.refresh_from_db()
    assert (account.rpm_ceiling, account.tpm_ceiling) == (7, None)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_gateway")
def test_the_gateway_holds_an_old_key_to_a_new_ceiling(gateway_server, simulator):
    make_model(model_id="acme/model-1", max_output_tokens=16)
    account = make_account(name="ceil-gw", credits=10)
    secret = make_key(account=account).secret  # unlimited key
    account_ceilings_set(account=account, rpm_ceiling=1, tpm_ceiling=None)
    register_worker(simulator.base_url)
    body = {"model": "acme/model-1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    headers = {"Authorization": f"Bearer {secret}"}
    first = httpx.post(gateway_server.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)
    second = httpx.post(gateway_server.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)
    assert first.status_code == 200
    assert second.status_code == 429 and second.json()["error"]["code"] == "rate_limit_exceeded"
