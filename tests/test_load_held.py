"""Load held (issue 22): a process at capacity answers a prompt 503 overloaded with Retry-After, and
waiting for its own resources (a pooled upstream connection, a database slot) is never a worker fault."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from accounts.models import Account
from billing.models import Reservation
from core import state
from runtimes.http import close_client
from workers.models import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_gateway")]


def post(world: Any, content: str, *, stream: bool = False, timeout: float = 10) -> httpx.Response:
    return httpx.post(
        world["url"] + "/v1/chat/completions",
        json={"model": "acme/model-1", "messages": [{"role": "user", "content": content}], "stream": stream},
        headers={"Authorization": f"Bearer {world['secret']}"},
        timeout=timeout,
    )


@pytest.fixture
def one_upstream_connection(settings: Any, gateway_server: Any) -> Iterator[None]:
    """The gateway's upstream pool holds one connection, and a call waits 0.3 s for it."""
    settings.SPEEDINFER_UPSTREAM_MAX_CONNECTIONS = 1
    settings.SPEEDINFER_UPSTREAM_CONNECT_TIMEOUT = 0.3
    state.reset()
    gateway_server.run_on_loop(close_client())  # the live server's client was built with the old limits
    yield
    settings.SPEEDINFER_UPSTREAM_MAX_CONNECTIONS = 4096
    state.reset()
    gateway_server.run_on_loop(close_client())


@pytest.mark.sqlite
@pytest.mark.usefixtures("one_upstream_connection")
def test_a_full_upstream_pool_is_503_overloaded_and_not_the_workers_fault(world):
    started = threading.Event()
    streamed: list[httpx.Response] = []

    def slow_stream() -> None:
        with httpx.stream(
            "POST",
            world["url"] + "/v1/chat/completions",
            json={"model": "acme/model-1", "messages": [{"role": "user", "content": "[sim deltas=20 delay=150]"}]}
            | {"stream": True},
            headers={"Authorization": f"Bearer {world['secret']}"},
            timeout=10,
        ) as response:
            for _ in response.iter_bytes():
                started.set()
            streamed.append(response)

    holder = threading.Thread(target=slow_stream)
    holder.start()
    assert started.wait(5)
    account = Account.objects.get(pk=world["account"].pk)
    for stream in (False, True):
        refused = post(world, "hello", stream=stream)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "overloaded"
        assert int(refused.headers["retry-after"]) >= 1
    holder.join(10)
    assert streamed and streamed[0].status_code == 200
    # The worker answered everything it was sent: no failure counted, still chosen.
    worker = Worker.objects.get(worker_id="sim-1")
    assert (worker.consecutive_failures, worker.circuit_state) == (0, "closed")
    assert post(world, "hello").status_code == 200
    # The refused requests held nothing and were charged nothing: only the two answered ones cost.
    after = Account.objects.get(pk=account.pk)
    assert after.reserved == 0
    assert not Reservation.objects.filter(status="held").exists()
    assert Reservation.objects.filter(status="settled").count() == 2


@pytest.mark.skipif("not __import__('django.db').db.connection.vendor == 'postgresql'")
def test_a_burst_queues_for_the_database_pool_instead_of_failing(world, settings, gateway_server):
    from concurrent.futures import ThreadPoolExecutor

    from core.pgpool import close_pool

    # One pooled connection and a 0.3 s checkout limit: 32 requests at once (a reserve and a settle each)
    # queue longer than that, yet the database is up, so every one is answered.
    settings.SPEEDINFER_DB_POOL_SIZE = 1
    settings.SPEEDINFER_DB_TIMEOUT = 0.3
    gateway_server.run_on_loop(close_pool())
    try:
        assert post(world, "warm").status_code == 200
        with ThreadPoolExecutor(32) as burst:
            statuses = list(burst.map(lambda i: post(world, f"burst {i}").status_code, range(32)))
    finally:
        settings.SPEEDINFER_DB_TIMEOUT = 2.0
        gateway_server.run_on_loop(close_pool())
    assert statuses == [200] * 32
    assert Reservation.objects.filter(status="settled").count() == 33


def _slow_stream(world: dict[str, Any], directive: str, started: threading.Barrier, *, timeout: float) -> int:
    """One stream read to its end; meets the others at `started` once its first bytes came. Its status."""
    with httpx.stream(
        "POST",
        world["url"] + "/v1/chat/completions",
        json={"model": "acme/model-1", "messages": [{"role": "user", "content": directive}], "stream": True},
        headers={"Authorization": f"Bearer {world['secret']}"},
        timeout=timeout,
    ) as response:
        first = True
        for _ in response.iter_bytes():
            if first:
                started.wait(timeout / 2)
                first = False
        return response.status_code


@pytest.mark.sqlite
def test_past_the_in_flight_limit_new_requests_get_a_prompt_503_overloaded(world, settings):
    import time

    settings.SPEEDINFER_MAX_INFLIGHT = 2
    state.reset()
    started = threading.Barrier(3)
    answered: list[int] = []

    def slow_stream() -> None:
        answered.append(_slow_stream(world, "[sim deltas=20 delay=150]", started, timeout=10))

    holders = [threading.Thread(target=slow_stream) for _ in range(2)]
    try:
        for holder in holders:
            holder.start()
        started.wait(5)  # both streams are open: the process is at its limit
        begun = time.perf_counter()
        refused = post(world, "hello")
        assert time.perf_counter() - begun < 1  # at once, not after a wait
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "overloaded"
        assert refused.headers["retry-after"] == "1"
        models = httpx.get(world["url"] + "/v1/models", headers={"Authorization": f"Bearer {world['secret']}"})
        assert models.status_code == 503
        # Outside /v1 (health checks, the dashboard) nothing is refused.
        assert httpx.get(world["url"] + "/health").status_code == 200
        for holder in holders:
            holder.join(10)
        assert answered == [200, 200]
        assert post(world, "hello").status_code == 200  # room again
    finally:
        settings.SPEEDINFER_MAX_INFLIGHT = 4000
        state.reset()
    assert not Reservation.objects.filter(status="held").exists()
    assert Reservation.objects.filter(status="settled").count() == 3


@pytest.mark.sqlite
def test_one_statement_per_interval_renews_every_running_requests_lease(world, monkeypatch, gateway_server):
    import time
    from datetime import timedelta

    from billing import services
    from billing.ledger import ledger
    from proxy import leases

    async def fresh_keeper() -> None:
        leases.keeper().stop()  # a keeper started by an earlier test sleeps its old interval

    monkeypatch.setattr(services, "LEASE_RENEW_EVERY", timedelta(seconds=0.3))
    gateway_server.run_on_loop(fresh_keeper())
    started = threading.Barrier(4)

    streams = [
        threading.Thread(
            target=_slow_stream, args=(world, "[sim deltas=12 delay=250]", started), kwargs={"timeout": 20}
        )
        for _ in range(3)
    ]
    for thread in streams:
        thread.start()
    started.wait(10)

    async def renewals() -> int:
        return leases.keeper().renewals

    held = dict(Reservation.objects.filter(status="held").values_list("pk", "lease_until"))
    assert len(held) == 3
    statements, renewed = ledger().loop_round_trips(), gateway_server.run_on_loop(renewals())
    time.sleep(1.0)
    statements_after, renewed_after = ledger().loop_round_trips(), gateway_server.run_on_loop(renewals())
    later = dict(Reservation.objects.filter(pk__in=held).values_list("pk", "lease_until"))
    for thread in streams:
        thread.join(20)
    # Every running request's lease moved forward, and the only statements meanwhile were the keeper's:
    # one per interval for all three, not one per request.
    assert all((later[pk] or held[pk]) > held[pk] for pk in held)  # type: ignore[operator]
    assert renewed_after - renewed >= 1
    # (A stray statement of an earlier test's close may land in the window; three renewals per interval cannot.)
    assert renewed_after - renewed <= statements_after - statements <= renewed_after - renewed + 1
    assert Reservation.objects.filter(status="settled").count() == 3
