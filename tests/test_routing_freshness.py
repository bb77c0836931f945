"""Routing freshness: a worker a probe marked down stops taking traffic within
SPEEDINFER_ROUTING_CACHE_TTL + 0.5 s, comes back as fast, and a gateway that is refused a connection
stops choosing that worker at once."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from tests.factories import make_account, make_key, make_model
from tests.servers import register_worker
from workers import routing
from workers.models import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_gateway")]
HELLO = {"model": "acme/model-1", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One loop for the test's routing calls (the snapshot refresh runs on its thread pool)."""
    loop = asyncio.new_event_loop()
    yield loop
    # End it as asyncio.run does: the background tasks it started (the fleet sync) are cancelled first.
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_default_executor())
    loop.close()
    if connection.vendor == "postgresql":  # the pool's threads leave their connections behind
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND application_name <> 'speedinfer-gateway'"
            )


def _eligible(loop: asyncio.AbstractEventLoop) -> list[str]:
    return [w.worker_id for w in loop.run_until_complete(routing.eligible_workers("acme/model-1"))]


def _probed(*, healthy: bool) -> None:
    """What a probe writes (the probes' own tests cover the probing)."""
    Worker.objects.filter(worker_id="sim-1").update(healthy=healthy, last_probe_at=timezone.now())


def _seconds_until(loop: asyncio.AbstractEventLoop, want: list[str]) -> float:
    started = time.monotonic()
    while _eligible(loop) != want:
        assert time.monotonic() - started < 5, f"routing still says {_eligible(loop)}"
        time.sleep(0.02)
    return time.monotonic() - started


def test_a_probe_result_reaches_routing_within_the_ttl_and_half_a_second(simulator, loop):
    make_model(model_id="acme/model-1")
    register_worker(simulator.base_url)
    limit = settings.SPEEDINFER_ROUTING_CACHE_TTL + 0.5

    assert _eligible(loop) == ["sim-1"]  # a snapshot loaded just now: the worst case for freshness
    _probed(healthy=False)
    down = _seconds_until(loop, [])
    assert down <= limit, down

    assert _eligible(loop) == []
    _probed(healthy=True)
    up = _seconds_until(loop, ["sim-1"])
    assert up <= limit, up
    print(f"routing: stopped {down:.2f} s after the probe, resumed {up:.2f} s after recovery (limit {limit} s)")

    # The first request after the TTL, on a stale snapshot that had no worker, is not turned away.
    _probed(healthy=False)
    _seconds_until(loop, [])
    _probed(healthy=True)
    time.sleep(settings.SPEEDINFER_ROUTING_CACHE_TTL)
    assert _eligible(loop) == ["sim-1"]


def test_a_refused_connection_stops_the_gateway_choosing_the_worker_at_once(gateway_server, loop):
    make_model(model_id="acme/model-1")
    account = make_account(credits=10)
    secret = make_key(account=account).secret
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{closed.getsockname()[1]}"  # bound, never listening: connections are refused
    register_worker(dead, probe=False)
    Worker.objects.filter(worker_id="sim-1").update(
        healthy=True, model_readiness={"acme/model-1": True}, last_probe_at=timezone.now()
    )
    routing.invalidate()

    def post() -> Any:
        return httpx.post(
            gateway_server.url + "/v1/chat/completions", json=HELLO, headers={"Authorization": f"Bearer {secret}"}
        )

    first = post()
    assert first.status_code == 502 and first.json()["error"]["code"] == "upstream_error"
    # The very next request is not sent to it (the database still says healthy until a probe).
    second = post()
    assert second.status_code == 503 and second.json()["error"]["code"] == "no_healthy_worker"
    assert _eligible(loop) == []

    # A later probe that finds it healthy brings it back.
    _probed(healthy=True)
    assert _seconds_until(loop, ["sim-1"]) <= settings.SPEEDINFER_ROUTING_CACHE_TTL + 0.5
    closed.close()
