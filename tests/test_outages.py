"""Dependency outages (docs/interface.md, Errors: 503 service_unavailable, never a hang, never a 500).

The gateway runs as its own process (uvicorn) whose DATABASE_URL and REDIS_URL point at TCP
forwarders (tests/tcp_forwarder.py); cutting a forwarder is, for the gateway, the database or Redis
going away, while the test itself keeps its direct connection to read the ledger.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from django.conf import settings
from django.db.models import Sum

from accounts.models import Account
from billing.models import LedgerEntry, Reservation, UsageRecord
from tests.factories import make_key
from tests.tcp_forwarder import TcpForwarder

pytestmark = [
    pytest.mark.slow,  # subprocess gateways, and cuts that wait out timeouts
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not settings.DATABASE_URL, reason="the outage tests cut PostgreSQL"),
]
HELLO = {"model": "acme/model-1", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}


def _forwarder(url: str, default_port: int) -> TcpForwarder:
    parts = urlsplit(url)
    return TcpForwarder(parts.hostname or "127.0.0.1", parts.port or default_port).start()


def _via(url: str, forwarder: TcpForwarder) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{forwarder.port}"
    return parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host).geturl()


@pytest.fixture
def pg(subprocess_env: dict[str, str]) -> Iterator[TcpForwarder]:
    forwarder = _forwarder(subprocess_env["DATABASE_URL"], 5432)
    yield forwarder
    forwarder.close()


@pytest.fixture
def redis_fwd() -> Iterator[TcpForwarder]:
    if not settings.REDIS_URL:
        pytest.skip("the Redis outage tests need REDIS_URL")
    forwarder = _forwarder(settings.REDIS_URL, 6379)
    yield forwarder
    forwarder.close()


class Gateway:
    """speedinfer.asgi:application under uvicorn in a child process."""

    def __init__(self, env: dict[str, str]) -> None:
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "speedinfer.asgi:application", "--port", str(self.port)]
            + ["--log-level", "warning", "--no-access-log"],
            env=env,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.get(self.url + "/health", timeout=1)
                return
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError("the gateway did not start")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


@pytest.fixture
def gateway_factory(subprocess_env: dict[str, str]) -> Iterator[Any]:
    started: list[Gateway] = []

    def start(**env: str) -> Gateway:
        gateway = Gateway({**subprocess_env, "SPEEDINFER_DB_TIMEOUT": "1", **env})
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        gateway.stop()


@pytest.fixture
def worker_latency_ms() -> int:
    return 0


@pytest.fixture
def world(
    make_world: Any, simulator_factory: Any, worker_latency_ms: int, subprocess_env: dict[str, str]
) -> dict[str, Any]:
    # The gateways are this test's own processes (gateway_factory), not the shared in-process one.
    world = make_world(worker=simulator_factory(latency_ms=worker_latency_ms).base_url, gateway=False)
    limited = make_key(account=world["account"], rpm=1000, tpm=1_000_000)
    return {**world, "limited": limited.secret, "database_url": subprocess_env["DATABASE_URL"]}


def _post(gateway: Gateway, secret: str, timeout: float = 10) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = httpx.post(
        gateway.url + "/v1/chat/completions",
        json=HELLO,
        headers={"Authorization": f"Bearer {secret}"},
        timeout=timeout,
    )
    return response, time.monotonic() - started


def _get(gateway: Gateway, path: str, secret: str) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = httpx.get(gateway.url + path, headers={"Authorization": f"Bearer {secret}"}, timeout=10)
    return response, time.monotonic() - started


def _assert_unavailable(response: httpx.Response, elapsed: float) -> None:
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "service_unavailable"
    assert set(response.json()["error"]) == {"message", "type", "code", "param"}
    assert elapsed < 3, elapsed


def _assert_ledger_reconciles(account: Account) -> None:
    after = Account.objects.get(pk=account.pk)
    assert not Reservation.objects.filter(account=after, status="held").exists()
    assert after.reserved == 0
    ledger = LedgerEntry.objects.filter(account=after).aggregate(a=Sum("available_delta"), r=Sum("reserved_delta"))
    assert (ledger["a"], ledger["r"]) == (after.available, after.reserved)


def _recovered_after(gateway: Gateway, secret: str) -> float:
    """Seconds until a chat request succeeds again."""
    started = time.monotonic()
    while time.monotonic() - started < 10:
        response, _ = _post(gateway, secret)
        if response.status_code == 200:
            return time.monotonic() - started
        assert response.status_code == 503, response.text
        time.sleep(0.1)
    raise AssertionError("the gateway did not recover")


def test_database_cut_is_a_prompt_503_and_service_returns_by_itself(world, pg, gateway_factory):
    gateway = gateway_factory(DATABASE_URL=_via(world["database_url"], pg))
    assert _post(gateway, world["secret"])[0].status_code == 200

    pg.stop()
    response, elapsed = _post(gateway, world["secret"])
    _assert_unavailable(response, elapsed)
    print(f"database cut: chat 503 in {elapsed:.2f} s")
    _assert_unavailable(*_get(gateway, "/v1/key", world["secret"]))
    _assert_unavailable(*_get(gateway, "/v1/usage", world["secret"]))
    health = httpx.get(gateway.url + "/health", timeout=10)
    assert health.status_code == 503
    assert health.json()["status"] == "unavailable" and health.json()["database"] == "unreachable"

    pg.start()
    recovered = _recovered_after(gateway, world["secret"])
    assert recovered < 5, recovered
    print(f"database restored: chat 200 again after {recovered:.2f} s")
    assert httpx.get(gateway.url + "/health", timeout=10).status_code == 200
    _assert_ledger_reconciles(world["account"])


@pytest.mark.parametrize("worker_latency_ms", [1500])  # time to cut the database between reserve and settle
def test_settle_lost_to_a_cut_is_written_when_the_database_returns(world, pg, gateway_factory):
    gateway = gateway_factory(DATABASE_URL=_via(world["database_url"], pg))
    result: dict[str, Any] = {}
    request = threading.Thread(target=lambda: result.update(answer=_post(gateway, world["secret"])))
    request.start()
    deadline = time.monotonic() + 5
    while not Reservation.objects.filter(status="held").exists():  # reserved: the worker is thinking
        assert time.monotonic() < deadline
        time.sleep(0.02)
    pg.stop()
    request.join(10)
    response, _ = result["answer"]
    # The worker answered, so the client gets its content; the settle waits for the database.
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert Reservation.objects.filter(status="held").count() == 1
    # The alert rule's gauge (docs/prometheus/alerts.yml, SpeedInferSettleQueued) is served while the database is cut.
    scraped = httpx.get(gateway.url + "/metrics", timeout=10)
    assert scraped.status_code == 200 and "\nspeedinfer_settles_queued 1.0\n" in scraped.text, scraped.text[-500:]

    pg.start()
    restored = time.monotonic()
    while Reservation.objects.filter(status="held").exists():
        assert time.monotonic() - restored < 5, "the queued settle was not written"
        time.sleep(0.1)
    print(f"queued settle written {time.monotonic() - restored:.2f} s after the database returned")
    assert "\nspeedinfer_settles_queued 0.0\n" in httpx.get(gateway.url + "/metrics", timeout=10).text
    reservation = Reservation.objects.get()
    assert reservation.status == "settled"
    record = UsageRecord.objects.get(reservation=reservation)
    assert (record.prompt_tokens, record.completion_tokens) == (usage["prompt_tokens"], usage["completion_tokens"])
    assert record.cost > 0  # the client got the content: it is paid for
    _assert_ledger_reconciles(world["account"])


def test_redis_cut_serves_from_the_local_limiter_or_503_as_configured(world, redis_fwd, gateway_factory):
    local = gateway_factory(REDIS_URL=_via(settings.REDIS_URL, redis_fwd))
    strict = gateway_factory(REDIS_URL=_via(settings.REDIS_URL, redis_fwd), SPEEDINFER_REDIS_OUTAGE="fail")
    for gateway in (local, strict):
        assert _post(gateway, world["limited"])[0].status_code == 200

    redis_fwd.stop()
    response, elapsed = _post(local, world["limited"])
    print(f"redis cut: local fallback answered in {elapsed:.2f} s")
    assert response.status_code == 200 and elapsed < 3, (response.text, elapsed)
    assert response.headers["x-ratelimit-limit-requests"] == "1000"
    _assert_unavailable(*_post(strict, world["limited"]))
    assert _post(strict, world["secret"])[0].status_code == 200  # an unlimited key needs no Redis

    redis_fwd.start()
    recovered = _recovered_after(strict, world["limited"])
    assert recovered < 5, recovered
    print(f"redis restored: limited key served again after {recovered:.2f} s")
    _assert_ledger_reconciles(world["account"])


def _signed_in_cookie(user: Any) -> dict[str, str]:
    """A session for `user` written straight to the session store, as a browser cookie would carry it."""
    from importlib import import_module

    store = import_module(settings.SESSION_ENGINE).SessionStore()
    store["_auth_user_id"] = str(user.pk)
    store["_auth_user_backend"] = "django.contrib.auth.backends.ModelBackend"
    store["_auth_user_hash"] = user.get_session_auth_hash()
    store.create()
    return {settings.SESSION_COOKIE_NAME: store.session_key or ""}


def test_database_cut_is_a_503_page_on_the_dashboard_and_the_admin(world, pg, gateway_factory, django_user_model):
    from accounts.services import account_user_create

    customer = account_user_create(account=world["account"], email="c@example.com", password="pw-123456789")
    staff = django_user_model.objects.create_user(username="ops", password="pw-123456789", is_staff=True)
    staff.is_superuser = True
    staff.save()
    gateway = gateway_factory(DATABASE_URL=_via(world["database_url"], pg))
    pages = [("/dashboard/", _signed_in_cookie(customer)), ("/admin/", _signed_in_cookie(staff))]
    for path, cookies in pages:
        assert httpx.get(gateway.url + path, cookies=cookies, timeout=10).status_code == 200

    pg.stop()
    for path, cookies in [*pages, ("/admin/billing/usagerecord/", pages[1][1])]:
        started = time.monotonic()
        page = httpx.get(gateway.url + path, cookies=cookies, timeout=10)
        assert page.status_code == 503, (path, page.text[:300])
        assert "Briefly unavailable" in page.text and "Traceback" not in page.text
        assert page.headers["Retry-After"] and time.monotonic() - started < 3

    pg.start()
    deadline = time.monotonic() + 10
    while httpx.get(gateway.url + "/dashboard/", cookies=pages[0][1], timeout=10).status_code != 200:
        assert time.monotonic() < deadline, "the dashboard did not come back"
        time.sleep(0.2)


def _journal_lines(var_dir: Any) -> list[dict[str, Any]]:
    import orjson

    return [
        orjson.loads(line)
        for path in sorted(var_dir.glob("journal/*.jsonl"))
        for line in path.read_bytes().splitlines()
    ]


@pytest.mark.parametrize("worker_latency_ms", [1500])  # time to cut the database between reserve and settle
def test_settle_queued_during_a_cut_survives_a_sigkill_and_is_charged_once(world, pg, gateway_factory, tmp_path):
    var_dir = tmp_path / "var"
    via_pg = _via(world["database_url"], pg)
    before = Account.objects.get(pk=world["account"].pk).available
    gateway = gateway_factory(DATABASE_URL=via_pg, SPEEDINFER_VAR_DIR=str(var_dir))
    result: dict[str, Any] = {}
    request = threading.Thread(target=lambda: result.update(answer=_post(gateway, world["secret"])))
    request.start()
    deadline = time.monotonic() + 5
    while not Reservation.objects.filter(status="held").exists():  # reserved: the worker is thinking
        assert time.monotonic() < deadline
        time.sleep(0.02)
    pg.stop()
    request.join(10)
    response, _ = result["answer"]
    assert response.status_code == 200, response.text  # the answer went out; its settle is queued
    usage = response.json()["usage"]
    reservation = Reservation.objects.get(status="held")
    journalled = _journal_lines(var_dir)
    assert [(e["op"], e["what"], e["reservation_id"]) for e in journalled] == [("close", "settle", str(reservation.pk))]

    gateway.process.kill()  # SIGKILL: no shutdown, no chance to write anything
    gateway.process.wait(10)
    # A successor starts while the database is still cut: it takes the journal over and keeps retrying.
    successor = gateway_factory(DATABASE_URL=via_pg, SPEEDINFER_VAR_DIR=str(var_dir))
    time.sleep(1.5)
    assert Reservation.objects.get(pk=reservation.pk).status == "held"
    pg.start()
    restored = time.monotonic()
    while Reservation.objects.get(pk=reservation.pk).status == "held":
        assert time.monotonic() - restored < 8, "the journalled settle was not written"
        time.sleep(0.1)
    print(f"journalled settle written by the successor {time.monotonic() - restored:.2f} s after the database returned")
    assert Reservation.objects.get(pk=reservation.pk).status == "settled"
    record = UsageRecord.objects.get(reservation=reservation)
    assert (record.prompt_tokens, record.completion_tokens) == (usage["prompt_tokens"], usage["completion_tokens"])
    # 1 micro-credit per prompt token, 2 per completion token (tests.factories.make_model's prices).
    assert record.cost == usage["prompt_tokens"] + 2 * usage["completion_tokens"] > 0
    assert Account.objects.get(pk=world["account"].pk).available == before - record.cost
    _assert_ledger_reconciles(world["account"])

    # A third process finds nothing left to replay: charged exactly once.
    successor.stop()
    third = gateway_factory(DATABASE_URL=via_pg, SPEEDINFER_VAR_DIR=str(var_dir))
    assert _post(third, world["secret"])[0].status_code == 200
    assert UsageRecord.objects.filter(reservation=reservation).count() == 1
    assert LedgerEntry.objects.filter(reference=str(reservation.pk)).count() == 2  # the hold and its settle
    settled = UsageRecord.objects.exclude(reservation=reservation).get()
    assert Account.objects.get(pk=world["account"].pk).available == before - record.cost - settled.cost
    assert all(e["op"] != "close" or e["reservation_id"] != str(reservation.pk) for e in _journal_lines(var_dir))
    _assert_ledger_reconciles(world["account"])
