"""Spend alerts: once per crossing, by email (a real SMTP server) and signed webhook (a real HTTP receiver),
retried on failure with the same id, configured by command, dashboard and admin."""

from __future__ import annotations

import email
import hashlib
import hmac
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone

from accounts.services import account_user_create
from alerts.models import AlertDelivery, AlertEvent, AlertSettings
from billing.services import credits_grant, credits_reserve, reservation_settle
from core.credits import MICRO
from core.models import AuditLog
from tests.factories import make_account, make_key, make_model

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parent.parent
OWNER = "owner@acme.test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Inbox:
    def __init__(self) -> None:
        self.port = 0
        self.messages: list[tuple[list[str], email.message.Message]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 - aiosmtpd's hook name
        self.messages.append((list(envelope.rcpt_tos), email.message_from_bytes(envelope.content)))
        return "250 OK"


@pytest.fixture
def smtp(settings: Any) -> Iterator[_Inbox]:
    """A real SMTP server on 127.0.0.1; Django's SMTP backend pointed at it (pytest-django would use locmem)."""
    inbox = _Inbox()
    port = inbox.port = _free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
    settings.EMAIL_USE_TLS = False
    yield inbox
    controller.stop()


class Receiver:
    """A webhook receiver on 127.0.0.1 that records every POST and answers `status`."""

    def __init__(self) -> None:
        self.status = 200
        self.requests: list[tuple[dict[str, str], bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's hook name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/speedinfer"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.requests]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """What a receiver does (docs/alerts.md): recompute the HMAC over "{t}.{raw body}"."""
    parts = dict(item.split("=", 1) for item in headers["speedinfer-signature"].split(","))
    expected = hmac.new(secret.encode(), f"{parts['t']}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, parts["v1"]) and abs(time.time() - int(parts["t"])) < 300


@pytest.fixture
def account():
    account = make_account(name="acme", credits=10)
    account_user_create(account=account, email=OWNER, password="correct horse battery staple")
    return account


def test_low_balance_alerts_once_per_crossing_by_email_and_signed_webhook(account, smtp, receiver):
    out = run("setalert", "acme", "--low-balance", "5", "--webhook", receiver.url)
    secret = out.strip().splitlines()[-1]
    assert secret.startswith("whsec_") and len(secret) > 30
    assert "below 5.00 credits" in out

    run("sendalerts")  # 10 available: above the line, nothing to say
    assert smtp.messages == [] and receiver.requests == []

    credits_grant(account=account, amount=-6 * MICRO, actor="test")  # 4 available: crossed
    assert "1 alert(s) raised; 2 delivered" in run("sendalerts")
    run("sendalerts")  # still below: the same crossing, no second alert
    credits_grant(account=account, amount=-1 * MICRO, actor="test")  # lower still, same dip
    run("sendalerts")
    assert len(smtp.messages) == 1 and len(receiver.requests) == 1

    rcpts, message = smtp.messages[0]
    assert rcpts == [OWNER]
    assert "below 5.00 credits" in message["Subject"]
    assert "4.00 credits" in message.get_payload()

    headers, body = receiver.requests[0]
    assert verify(secret, headers, body)
    assert not verify("whsec_wrong", headers, body)
    document = json.loads(body)
    assert set(document) == {"id", "type", "created", "account", "data"}
    assert document["type"] == "balance.low" and document["id"].startswith("evt_")
    assert document["account"] == {"id": account.pk, "name": "acme"}
    assert document["data"] == {"available": "4.000000", "threshold": "5.000000"}
    assert headers["content-type"] == "application/json"

    credits_grant(account=account, amount=10 * MICRO, actor="test")  # 13: back above, re-armed
    run("sendalerts")
    assert len(receiver.requests) == 1
    credits_grant(account=account, amount=-12 * MICRO, actor="test")  # 1: a new crossing
    run("sendalerts")
    assert len(smtp.messages) == 2 and len(receiver.requests) == 2
    second = receiver.bodies()[1]
    assert second["type"] == "balance.low" and second["id"] != document["id"]
    assert second["data"]["available"] == "1.000000"
    assert all(d.status == "delivered" and d.attempts == 1 for d in AlertDelivery.objects.all())


def test_a_receiver_answering_500_is_retried_with_the_same_id_then_marked_failed(account, receiver):
    receiver.status = 500
    run("setalert", "acme", "--low-balance", "20", "--webhook", receiver.url)
    assert "1 delivered, 1 to retry" in run("sendalerts")  # the owner's email (locmem here) and the webhook
    delivery = AlertDelivery.objects.get(channel="webhook")
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("pending", 1, 500)
    assert delivery.last_attempt_at is not None
    first_wait = delivery.next_attempt_at - delivery.last_attempt_at
    assert first_wait >= timedelta(seconds=10)

    run("sendalerts")  # sooner than 10 s later: not yet
    assert len(receiver.requests) == 1

    AlertDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now() - timedelta(seconds=1))
    run("sendalerts")
    delivery.refresh_from_db()
    assert len(receiver.requests) == 2 and delivery.attempts == 2 and delivery.status == "pending"
    assert delivery.last_attempt_at is not None
    assert delivery.next_attempt_at - delivery.last_attempt_at > first_wait  # the backoff grows
    ids = {body["id"] for body in receiver.bodies()}
    assert len(ids) == 1  # a retry is the same event

    # A day after the first attempt, the next failure is the last.
    AlertDelivery.objects.filter(pk=delivery.pk).update(
        first_attempt_at=timezone.now() - timedelta(hours=24, seconds=1),
        next_attempt_at=timezone.now() - timedelta(seconds=1),
    )
    assert "1 failed" in run("sendalerts")
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, len(receiver.requests)) == ("failed", 3, 3)
    AlertDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now() - timedelta(hours=1))
    run("sendalerts")
    assert len(receiver.requests) == 3  # failed is final


def test_a_receiver_that_recovers_gets_the_retry_and_an_unreachable_one_is_retried(account, receiver):
    receiver.status = 503
    run("setalert", "acme", "--low-balance", "20", "--webhook", receiver.url)
    run("sendalerts")
    receiver.status = 204
    AlertDelivery.objects.update(next_attempt_at=timezone.now() - timedelta(seconds=1))
    run("sendalerts")
    delivery = AlertDelivery.objects.get(channel="webhook")
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("delivered", 2, 204)
    assert receiver.bodies()[0] == receiver.bodies()[1]

    # Nothing listening: a connection error is retried like a 500.
    dead = f"http://127.0.0.1:{_free_port()}/hook"
    run("setalert", "acme", "--webhook", dead, "--low-balance", "30")
    run("sendalerts")
    unreachable = AlertDelivery.objects.get(channel="webhook", target=dead)
    assert unreachable.status == "pending" and unreachable.last_status_code is None and unreachable.last_error

    # The customer corrects the URL: the retry goes there, the same event, signed with the new secret.
    secret = run("setalert", "acme", "--webhook", receiver.url).strip().splitlines()[-1]
    AlertDelivery.objects.filter(pk=unreachable.pk).update(next_attempt_at=timezone.now() - timedelta(seconds=1))
    run("sendalerts")
    unreachable.refresh_from_db()
    assert (unreachable.status, unreachable.target, unreachable.attempts) == ("delivered", receiver.url, 2)
    headers, body = receiver.requests[-1]
    assert json.loads(body)["id"] == unreachable.event_id and verify(secret, headers, body)


def _spend(*, account, key, credits: float) -> None:
    """Settle a request on `key` that cost `credits` (the model charges 1 credit per million input tokens)."""
    model = make_model(model_id="acme/alert-model", input_price=MICRO, output_price=MICRO)
    tokens = int(credits * 1_000_000)
    held = credits_reserve(account_id=account.pk, amount=tokens, model=model, api_key_id=key.pk, budget=None)
    reservation_settle(reservation_id=held.pk, prompt_tokens=tokens, completion_tokens=0)


def test_key_budget_80_and_100_percent_fire_once_each(account, smtp, receiver):
    credits_grant(account=account, amount=100 * MICRO, actor="test")
    key = make_key(account=account, name="ci", monthly_budget=10 * MICRO).api_key
    other = make_key(account=account, name="no-budget").api_key
    run("setalert", "acme", "--budget-percent", "100,80", "--webhook", receiver.url)
    assert AlertSettings.objects.get(account=account).budget_percents == [80, 100]

    _spend(account=account, key=key, credits=7.5)
    _spend(account=account, key=other, credits=20)
    run("sendalerts")
    assert receiver.requests == []  # 75%: under both

    _spend(account=account, key=key, credits=1)  # 85%
    run("sendalerts")
    run("sendalerts")
    assert [(b["type"], b["data"]["percent"]) for b in receiver.bodies()] == [("key.budget", 80)]
    data = receiver.bodies()[0]["data"]
    assert data["key"] == {"id": key.pk, "name": "ci", "prefix": key.prefix}
    assert (data["budget"], data["spent"]) == ("10.000000", "8.500000")
    assert "80%" in smtp.messages[0][1]["Subject"]
    assert "has spent 8.50 of its 10.00 credits budget" in smtp.messages[0][1].get_payload()

    _spend(account=account, key=key, credits=1.5)  # 100%
    run("sendalerts")
    _spend(account=account, key=key, credits=0.5)  # past the budget: no new line crossed
    run("sendalerts")
    assert [b["data"]["percent"] for b in receiver.bodies()] == [80, 100]
    assert len(smtp.messages) == 2
    assert AlertEvent.objects.filter(type="key.budget").count() == 2


def test_setalert_refuses_bad_input_with_exit_1_and_one_line(subprocess_env):
    make_account(name="acme")

    def setalert(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # noqa: S603 - our own manage.py
            [sys.executable, "manage.py", "setalert", "acme", *args],
            cwd=ROOT,
            env=subprocess_env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    for args, option in (
        (["--webhook", "https://user:pass@hooks.example.test/x"], "--webhook"),
        (["--webhook", "ftp://hooks.example.test/x"], "--webhook"),
        (["--budget-percent", "80,0"], "--budget-percent"),
        (["--low-balance", "-1"], "--low-balance"),
    ):
        proc = setalert(*args)
        assert proc.returncode == 1, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and option in lines[0] and "Traceback" not in proc.stderr
    assert not AlertSettings.objects.exists()
    proc = setalert("--webhook", "https://hooks.example.test/x", "--budget-percent", "1000")
    assert proc.returncode == 0
    secret = proc.stdout.strip().splitlines()[-1]
    assert AlertSettings.objects.get().webhook_secret == secret


def test_setalert_is_audited_without_the_secret(account):
    out = run("setalert", str(account.pk), "--webhook", "https://h.example.test/a")
    secret = out.strip().splitlines()[-1]
    entry = AuditLog.objects.get(action="alerts.update")
    assert entry.actor == "manage.py setalert" and entry.target_id == str(account.pk)
    assert entry.detail["webhook_url"] == "https://h.example.test/a" and secret not in json.dumps(entry.detail)
    with pytest.raises(CommandError, match="--webhook"):
        run("setalert", "acme", "--webhook", "https://u@h.example.test/a")


def test_sendalerts_emails_through_EMAIL_HOST_and_EMAIL_PORT(subprocess_env, smtp):  # noqa: N802
    account = make_account(name="acme", credits=1)
    account_user_create(account=account, email=OWNER, password="correct horse battery staple")
    run("setalert", "acme", "--low-balance", "2")
    env = {**subprocess_env, "EMAIL_HOST": "127.0.0.1", "EMAIL_PORT": str(smtp.port)}
    proc = subprocess.run(  # noqa: S603 - our own manage.py
        [sys.executable, "manage.py", "sendalerts"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "1 alert(s) raised; 1 delivered" in proc.stdout
    assert [rcpts for rcpts, _ in smtp.messages] == [[OWNER]]


def test_the_dashboard_owner_sets_alerts_and_sees_the_secret_once(account, receiver):
    client = Client()
    client.force_login(get_user_model().objects.get(username=OWNER))
    page = client.get("/dashboard/alerts/")
    assert page.status_code == 200 and b"No alerts yet" in page.content

    refused = client.post("/dashboard/alerts/", {"webhook_url": "ftp://x.example.test/", "budget_percents": "80"})
    assert refused.status_code == 400 and b"http:// or https://" in refused.content
    assert not AlertSettings.objects.exists()

    saved = client.post(
        "/dashboard/alerts/", {"low_balance": "2.5", "webhook_url": receiver.url, "budget_percents": "80, 100%"}
    )
    assert saved.status_code == 302
    row = AlertSettings.objects.get(account=account)
    assert (row.low_balance, row.budget_percents, row.webhook_url) == (2_500_000, [80, 100], receiver.url)
    shown = client.get(saved["Location"])
    assert row.webhook_secret.encode() in shown.content and shown["Cache-Control"] == "no-store"
    again = client.get("/dashboard/alerts/")
    assert row.webhook_secret.encode() not in again.content  # once
    assert b'value="2.5"' in again.content and b"80, 100" in again.content
    entry = AuditLog.objects.get(action="alerts.update")
    assert entry.actor == OWNER and entry.detail["via"] == "dashboard"

    # The delivery log shows on the page.
    credits_grant(account=account, amount=-8 * MICRO, actor="test")
    run("sendalerts")
    assert b"balance.low" in client.get("/dashboard/alerts/").content

    staff = get_user_model().objects.create_user(username="staff@op.test", password="x" * 12, is_staff=True)
    client.force_login(staff)
    assert client.get("/dashboard/alerts/").status_code == 403  # no account of their own


def test_the_admin_edits_settings_audited_and_the_delivery_log_is_read_only(account, receiver):
    staff = get_user_model().objects.create_superuser(username="admin", password="x" * 12, email="a@op.test")
    client = Client()
    client.force_login(staff)
    assert b"Set up alerts" in client.get(f"/admin/accounts/account/{account.pk}/change/").content
    refused = client.post(
        "/admin/alerts/alertsettings/add/",
        {"account": account.pk, "webhook_url": "https://u:p@h.example.test/", "percents": "90"},
    )
    assert refused.status_code == 200 and b"must not contain credentials" in refused.content
    assert not AlertSettings.objects.exists()
    added = client.post(
        "/admin/alerts/alertsettings/add/",
        {"account": account.pk, "low_balance_credits": "3", "webhook_url": receiver.url, "percents": "90"},
    )
    assert added.status_code == 302, added.content.decode()[:2000]
    row = AlertSettings.objects.get(account=account)
    assert (row.low_balance, row.budget_percents) == (3 * MICRO, [90]) and row.webhook_secret
    assert AuditLog.objects.get(action="alerts.update").detail["via"] == "admin"
    account_page = client.get(f"/admin/accounts/account/{account.pk}/change/").content.decode()
    assert "Low balance below 3.00 credits; key budgets 90%; webhook on" in account_page

    credits_grant(account=account, amount=-8 * MICRO, actor="test")
    run("sendalerts")
    log = client.get("/admin/alerts/alertdelivery/", {"q": "acme"})
    assert log.status_code == 200 and b"webhook" in log.content and b"delivered" in log.content
    assert client.get("/admin/alerts/alertdelivery/add/").status_code == 403
    delivery = AlertDelivery.objects.first()
    assert delivery is not None
    assert client.post(f"/admin/alerts/alertdelivery/{delivery.pk}/delete/", {"post": "yes"}).status_code == 403
    assert client.get(f"/admin/alerts/alertevent/{delivery.event_id}/change/").status_code == 200


def test_the_embedded_schedule_sends_alerts(subprocess_env, receiver):
    """`manage.py runschedule` (the schedule without Celery, which `make run` starts) runs sendalerts."""
    make_account(name="acme", credits=1)
    run("setalert", "acme", "--low-balance", "2", "--webhook", receiver.url)
    env = {**subprocess_env, "SPEEDINFER_ALERTS_INTERVAL": "1", "SPEEDINFER_PROBE_INTERVAL": "60"}
    proc = subprocess.Popen(  # noqa: S603 - our own manage.py
        [sys.executable, "manage.py", "runschedule"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while not receiver.requests and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert [body["type"] for body in receiver.bodies()] == ["balance.low"]
