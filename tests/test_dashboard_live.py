"""The live usage feed: a committed usage record reaches its account's open dashboards, only theirs."""

from __future__ import annotations

import time
import uuid

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from accounts.services import account_user_create
from billing.services import (
    credits_reserve,
    reservation_release_async,
    reservation_settle,
    reservation_settle_async,
)
from core.credits import MICRO, display_credits, format_credits
from core.outcome import RequestOutcome
from core.pgpool import close_pool
from speedinfer.asgi import application
from tests.factories import make_account, make_model

PASSWORD = "correct horse battery staple"


def session_cookie(email: str) -> bytes:
    client = Client()
    assert client.login(username=email, password=PASSWORD)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def settle(account_id: int, model, request_id: str):
    reservation = credits_reserve(account_id=account_id, amount=MICRO, model=model, request_id=request_id)
    return reservation_settle(
        reservation_id=reservation.pk,
        prompt_tokens=100,
        completion_tokens=50,
        outcome=RequestOutcome(request_id="", worker_id="w1", latency=(77) / 1000),
    )


async def receive_summary(communicator: WebsocketCommunicator, *, ours: set[str], within: float) -> dict:
    """The next message that is not a parallel test's row (xdist workers share the Redis channel layer, and
    their accounts' ids can coincide); a row of one of `ours` again is returned, so the caller sees it."""
    deadline = time.monotonic() + within
    while True:
        message = await communicator.receive_json_from(timeout=max(0.01, deadline - time.monotonic()))
        if message.get("type") != "usage" or message.get("usage", {}).get("request_id") in ours:
            return message


async def receive_for(communicator: WebsocketCommunicator, request_id: str, within: float) -> dict | None:
    """The message about `request_id`; others (a parallel test's) are skipped."""
    deadline = time.monotonic() + within
    while (left := deadline - time.monotonic()) > 0:
        try:
            message = await communicator.receive_json_from(timeout=left)
        except TimeoutError:
            return None
        if message.get("usage", {}).get("request_id") == request_id:
            return message
    return None


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("ending", ["settle", "settle_async", "release_async"])
def test_every_way_a_request_ends_pushes_its_row_once_to_the_open_dashboard(ending):
    """The console's listener is registered with billing at start-up, and every ending the gateway uses
    (settled from a thread, settled or failed on the event loop) reaches the feed exactly once."""
    model = make_model(model_id="acme/live-once")
    account = make_account(name=f"live-once-{uuid.uuid4().hex[:6]}", credits=10)
    account_user_create(account=account, email="once@live.example", password=PASSWORD)
    cookie = session_cookie("once@live.example")
    request_id = f"once-{uuid.uuid4().hex}"

    async def end() -> None:
        reserve = database_sync_to_async(credits_reserve)
        reservation = await reserve(account_id=account.pk, amount=MICRO, model=model, request_id=request_id)
        outcome = RequestOutcome(request_id=request_id, worker_id="w1", latency=0.05)
        if ending == "settle":
            await database_sync_to_async(reservation_settle)(
                reservation_id=reservation.pk, prompt_tokens=100, completion_tokens=50, outcome=outcome
            )
        elif ending == "settle_async":
            await reservation_settle_async(
                reservation_id=reservation.pk, prompt_tokens=100, completion_tokens=50, outcome=outcome
            )
        else:
            await reservation_release_async(reservation_id=reservation.pk, error_code="upstream_error", outcome=outcome)

    async def scenario() -> None:
        feed = WebsocketCommunicator(application, "/ws/usage/", headers=[(b"cookie", cookie)])
        assert (await feed.connect())[0]
        await end()
        message = await receive_for(feed, request_id, within=5)
        assert message is not None, f"no live row after {ending}"
        usage = message["usage"]
        assert usage["model"] == "acme/live-once" and usage["latency_ms"] == 50
        if ending == "release_async":
            assert usage["status"] == "failed" and usage["cost"] == "0.000000"
        else:
            assert usage["status"] == "ok" and usage["cost"] == "0.000200"
        assert await feed.receive_nothing(timeout=0.5)  # once, not once per registration
        await feed.disconnect()
        await close_pool()  # this loop's pooled connections, so the test database can be dropped

    async_to_sync(scenario)()


@pytest.fixture(params=["redis", "in-memory"])
def layer(request, settings):
    """Redis in production; the in-memory layer of the embedded default (same process, the server's loop)."""
    from channels.layers import channel_layers

    if request.param == "in-memory":
        settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends.pop("default", None)
    yield request.param
    channel_layers.backends.pop("default", None)


@pytest.mark.django_db(transaction=True)
def test_owner_sees_new_usage_live_and_outsider_does_not(layer):
    model = make_model(model_id="acme/live")
    owner_account = make_account(name=f"live-owner-{uuid.uuid4().hex[:6]}", credits=10)
    outsider_account = make_account(name=f"live-outsider-{uuid.uuid4().hex[:6]}", credits=10)
    account_user_create(account=owner_account, email="owner@live.example", password=PASSWORD)
    account_user_create(account=outsider_account, email="outsider@live.example", password=PASSWORD)
    owner_cookie, outsider_cookie = session_cookie("owner@live.example"), session_cookie("outsider@live.example")
    request_id = f"live-{uuid.uuid4().hex}"

    async def scenario() -> None:
        owner = WebsocketCommunicator(application, "/ws/usage/", headers=[(b"cookie", owner_cookie)])
        outsider = WebsocketCommunicator(application, "/ws/usage/", headers=[(b"cookie", outsider_cookie)])
        assert (await owner.connect())[0] and (await outsider.connect())[0]
        # Settled in a sync_to_async thread, as the gateway does: the push goes to this loop.
        await database_sync_to_async(settle)(owner_account.pk, model, request_id)
        message = await receive_for(owner, request_id, within=5)
        assert message is not None
        usage = message["usage"]
        assert usage["model"] == "acme/live" and usage["cost"] == "0.000200" and usage["status"] == "ok"
        assert usage["prompt_tokens"] == 100 and usage["latency_ms"] == 77
        assert "api_key" not in usage and "worker" not in usage
        # The overview cards follow: the first event carries them, as the page would show them.
        cards = message["summary"]
        assert cards["available_exact"] == format_credits(10 * MICRO - 200) and cards["requests_today"] == 1
        assert cards["spend_month"] == display_credits(200) and cards["reserved_exact"] == "0.000000"
        # A second request within the second: its row at once, the cards in one trailing update.
        second = f"{request_id}-2"
        await database_sync_to_async(settle)(owner_account.pk, model, second)
        assert "summary" not in (await receive_for(owner, second, within=5) or {"summary": "missing row"})
        trailing = await receive_summary(owner, ours={request_id, second}, within=3)
        assert trailing["type"] == "summary" and trailing["summary"]["requests_today"] == 2
        assert trailing["summary"]["spend_month_exact"] == format_credits(400)
        assert await outsider.receive_nothing(timeout=0.5)
        await owner.disconnect()
        await outsider.disconnect()

    async_to_sync(scenario)()


@pytest.mark.django_db(transaction=True)
def test_anonymous_and_accountless_sockets_are_refused(django_user_model):
    django_user_model.objects.create_user(username="staff@live.example", password=PASSWORD, is_staff=True)
    cookie = session_cookie("staff@live.example")

    async def scenario() -> None:
        anonymous = WebsocketCommunicator(application, "/ws/usage/")
        connected, _ = await anonymous.connect()
        assert not connected
        accountless = WebsocketCommunicator(application, "/ws/usage/", headers=[(b"cookie", cookie)])
        connected, _ = await accountless.connect()
        assert not connected

    async_to_sync(scenario)()


@pytest.mark.django_db(transaction=True)
def test_a_failing_channel_layer_never_fails_the_settlement(settings, caplog):
    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": ["redis://127.0.0.1:1/0"]}}
    }
    from channels.layers import channel_layers

    channel_layers.backends.pop("default", None)
    try:
        model = make_model(model_id="acme/live-broken")
        account = make_account(name="broken-layer", credits=10)
        started = time.perf_counter()
        record = settle(account.pk, model, f"broken-{uuid.uuid4().hex}")
        elapsed = time.perf_counter() - started
        assert record is not None and record.cost == 200
        assert elapsed < 1.0  # the push is handed off, never awaited on the request path
    finally:
        channel_layers.backends.pop("default", None)
