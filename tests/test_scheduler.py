"""Scheduling a GPU fleet (docs/scheduler.md): prefix affinity, capacity, the gateway-side queue, priorities.

Workers are simulators (devtools/simulator.py) behind the real gateway; the two-process test runs two
gateway processes against one worker through Redis.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.core.exceptions import ValidationError

from billing.models import Reservation, UsageRecord
from devtools.simulator import Behaviour, GpuModel, Simulator, SimulatorThread
from tests.factories import make_account, make_key, make_model, money
from tests.servers import register_worker
from workers import balancer, prefix
from workers.registration import registration_validate

MODEL = "acme/model-1"
ROOT = Path(__file__).resolve().parent.parent
SYSTEM = "You are the support assistant of tenant {n}. " + "Answer with care and cite the policy. " * 40

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_gateway")]


@pytest.fixture
def fleet(gateway_server: Any) -> Any:
    """start(n, **simulator) -> n simulators registered for MODEL as w0..w(n-1); the world's secrets."""
    started: list[SimulatorThread] = []

    def start(n: int, *, latency_ms: float = 0, capacity: int | None = None, gpu: GpuModel | None = None) -> Any:
        for i in range(n):
            sim = SimulatorThread(
                Simulator(behaviour=Behaviour(latency_ms=latency_ms, deltas=2), max_concurrency=capacity or 0, gpu=gpu)
            ).start()
            started.append(sim)
            extra: dict[str, Any] = {"max_concurrency": capacity} if capacity else {}
            register_worker(sim.base_url, worker_id=f"w{i}", **extra)
        return started

    make_model(model_id=MODEL, max_output_tokens=8)
    balancer.forget()
    yield start
    balancer.forget()
    for sim in started:
        sim.stop()


def _secret(name: str = "tenant", **key: Any) -> str:
    return make_key(account=make_account(name=name, credits=100), **key).secret


def _chat(url: str, secret: str, content: str, *, system: str = "", **extra: Any) -> httpx.Response:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
    return httpx.post(
        url + "/v1/chat/completions",
        json={"model": MODEL, "max_tokens": 2, "messages": messages, **extra},
        headers={"Authorization": f"Bearer {secret}"},
        timeout=30,
    )


async def _achat(http: httpx.AsyncClient, secret: str, content: str, **extra: Any) -> tuple[httpx.Response, float]:
    started = time.perf_counter()
    response = await http.post(
        "/v1/chat/completions",
        json={"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": content}], **extra},
        headers={"Authorization": f"Bearer {secret}"},
    )
    return response, time.perf_counter() - started


def _served_by(sims: list[SimulatorThread]) -> list[int]:
    return [sim.simulator.stats.completed for sim in sims]


def test_requests_sharing_a_prefix_stick_to_one_worker(gateway_server, fleet, settings):
    settings.SPEEDINFER_ROUTING_POLICY = "prefix"
    sims = fleet(3)
    secret = _secret()
    for tenant in range(2):
        before = _served_by(sims)
        for i in range(6):
            assert _chat(gateway_server.url, secret, f"question {i}", system=SYSTEM.format(n=tenant)).status_code == 200
        delta = [after - b for after, b in zip(_served_by(sims), before, strict=True)]
        assert sorted(delta) == [0, 0, 6], delta  # every request of the tenant went to one worker
    hits = prefix.hit_estimates()
    assert sum(matched for matched, _ in hits.values()) > 0.7 * sum(asked for _, asked in hits.values())


def test_prompt_cache_key_sticks_even_without_a_shared_prefix(gateway_server, fleet, settings):
    settings.SPEEDINFER_ROUTING_POLICY = "prefix"
    sims = fleet(3)
    secret = _secret()
    for i in range(6):
        assert _chat(gateway_server.url, secret, f"unique {i}", prompt_cache_key="user-42").status_code == 200
    assert sorted(_served_by(sims)) == [0, 0, 6]


def test_a_prompt_cache_key_that_is_not_a_string_is_refused(gateway_server, fleet):
    fleet(1)
    response = _chat(gateway_server.url, _secret(), "hi", prompt_cache_key=42)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "prompt_cache_key"


def test_a_hot_prefix_spreads_over_the_workers(gateway_server, fleet, settings):
    settings.SPEEDINFER_ROUTING_POLICY = "prefix"
    sims = fleet(3, latency_ms=150)
    secret = _secret()

    async def main() -> None:
        async with httpx.AsyncClient(base_url=gateway_server.url, timeout=30) as http:
            for _ in range(3):
                results = await asyncio.gather(*(_achat(http, secret, SYSTEM.format(n=0) + f" q{i}") for i in range(9)))
                assert {r.status_code for r, _ in results} == {200}

    asyncio.run(main())
    served = _served_by(sims)
    # Bounded load: the holder does not take them all; the prefix spreads to as many workers as its load
    # needs (two here: nine at once against a bound of 1.5 x the mean + 1 each).
    assert sum(1 for n in served if n) >= 2 and max(served) <= 0.7 * sum(served), served


def test_a_worker_never_runs_more_than_its_capacity(gateway_server, fleet):
    sims = fleet(1, latency_ms=100, capacity=2)
    secret = _secret()

    async def main() -> list[int]:
        async with httpx.AsyncClient(base_url=gateway_server.url, timeout=30) as http:
            results = await asyncio.gather(*(_achat(http, secret, f"q{i}") for i in range(8)))
        return [r.status_code for r, _ in results]

    assert asyncio.run(main()) == [200] * 8
    stats = sims[0].simulator.stats
    assert stats.peak_running == 2 and stats.waiting == 0
    waits = list(UsageRecord.objects.values_list("queue_wait_ms", flat=True))
    assert len(waits) == 8 and max(waits) >= 150  # the last pair waited for three pairs before them


def test_a_quiet_account_is_not_starved_by_a_noisy_one(gateway_server, fleet):
    fleet(1, latency_ms=100, capacity=1)
    noisy, quiet = _secret("noisy"), _secret("quiet")
    finished: list[str] = []

    async def send(http: httpx.AsyncClient, who: str, secret: str) -> httpx.Response:
        response, _ = await _achat(http, secret, who)
        finished.append(who)
        return response

    async def main() -> None:
        async with httpx.AsyncClient(base_url=gateway_server.url, timeout=30) as http:
            burst = [asyncio.ensure_future(send(http, "noisy", noisy)) for _ in range(10)]
            await asyncio.sleep(0.15)  # the burst is queued first
            assert (await send(http, "quiet", quiet)).status_code == 200
            assert {r.status_code for r in await asyncio.gather(*burst)} == {200}

    asyncio.run(main())
    # In turn: the quiet account's one request goes next (after the noisy one running and, at most, the
    # noisy one whose turn it was), not after the nine noisy ones waiting before it (first come, first served).
    assert finished.index("quiet") <= 3, finished


def test_high_priority_goes_first_and_low_is_refused_at_once(gateway_server, fleet):
    fleet(1, latency_ms=150, capacity=1)
    normal, high, low = _secret("normal"), _secret("high", priority="high"), _secret("low", priority="low")
    finished: list[str] = []

    async def send(http: httpx.AsyncClient, who: str, secret: str) -> httpx.Response:
        response, _ = await _achat(http, secret, who)
        finished.append(who)
        return response

    async def main() -> httpx.Response:
        async with httpx.AsyncClient(base_url=gateway_server.url, timeout=30) as http:
            first = asyncio.ensure_future(send(http, "running", normal))
            await asyncio.sleep(0.05)
            waiting = [asyncio.ensure_future(send(http, f"normal{i}", normal)) for i in range(3)]
            await asyncio.sleep(0.05)
            urgent = asyncio.ensure_future(send(http, "high", high))
            await asyncio.sleep(0.02)
            refused, _ = await _achat(http, low, "low")
            assert len(finished) <= 3  # at once: not after the four ahead of it, as a wait would have been
            results = await asyncio.gather(first, urgent, *waiting)
            assert {r.status_code for r in results} == {200}
            return refused

    refused = asyncio.run(main())
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "overloaded"
    assert int(refused.headers["retry-after"]) >= 1
    assert finished.index("high") == 1  # right after the one that was running
    assert UsageRecord.objects.count() == 5  # nothing recorded for the refused one
    metrics = _metrics(gateway_server.url)
    assert metrics[("speedinfer_overloaded_total", (("model", MODEL), ("priority", "low")))] == 1
    assert metrics[("speedinfer_queue_waited_total", (("model", MODEL), ("priority", "high")))] == 1
    assert metrics[("speedinfer_queue_wait_seconds_total", (("model", MODEL), ("priority", "normal")))] > 0
    assert metrics[("speedinfer_worker_capacity", (("worker", "w0"),))] == 1


def _metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(httpx.get(url + "/metrics").text)
        for sample in family.samples
    }


def test_a_wait_past_the_queue_timeout_is_503_and_nothing_is_charged_or_held(gateway_server, fleet, settings):
    settings.SPEEDINFER_QUEUE_TIMEOUT = 0.3
    fleet(1, latency_ms=1200, capacity=1)
    holder = _secret("holder")
    account = make_account(name="waiter", credits=100)
    waiter = make_key(account=account).secret
    before = money(account)

    async def main() -> tuple[httpx.Response, float]:
        async with httpx.AsyncClient(base_url=gateway_server.url, timeout=30) as http:
            running = asyncio.ensure_future(_achat(http, holder, "long"))
            await asyncio.sleep(0.1)
            response, waited = await _achat(http, waiter, "short")
            assert await asyncio.to_thread(money, account) == before  # nothing held while it waited
            assert (await running)[0].status_code == 200
            return response, waited

    response, waited = asyncio.run(main())
    assert response.status_code == 503 and response.json()["error"]["code"] == "overloaded"
    assert int(response.headers["retry-after"]) >= 1
    assert 0.25 < waited < 1.0
    assert money(account) == before
    assert not Reservation.objects.filter(account=account).exists()
    assert not UsageRecord.objects.filter(account=account).exists()


def test_two_gateway_processes_never_overfill_a_worker(fleet, subprocess_env, settings):
    if not settings.REDIS_URL:
        pytest.skip("gateway processes share capacity through Redis")
    sims = fleet(1, latency_ms=150, capacity=2)
    secret = _secret()
    gateways = [_Gateway(subprocess_env) for _ in range(2)]
    try:

        async def main() -> list[int]:
            async with httpx.AsyncClient(timeout=30) as http:

                async def one(i: int) -> int:
                    response = await http.post(
                        gateways[i % 2].url + "/v1/chat/completions",
                        json={"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": f"q{i}"}]},
                        headers={"Authorization": f"Bearer {secret}"},
                    )
                    return response.status_code

                return list(await asyncio.gather(*(one(i) for i in range(12))))

        assert asyncio.run(main()) == [200] * 12
    finally:
        for gateway in gateways:
            gateway.stop()
    assert sims[0].simulator.stats.peak_running == 2


def test_fair_share_holds_across_two_gateway_processes(fleet, subprocess_env, settings):
    if not settings.REDIS_URL:
        pytest.skip("gateway processes share capacity through Redis")
    fleet(1, latency_ms=100, capacity=1)
    noisy, quiet = _secret("noisy"), _secret("quiet")
    gateways = [_Gateway(subprocess_env) for _ in range(2)]
    finished: list[str] = []
    try:

        async def send(http: httpx.AsyncClient, url: str, who: str, secret: str) -> int:
            response = await http.post(
                url + "/v1/chat/completions",
                json={"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": who}]},
                headers={"Authorization": f"Bearer {secret}"},
            )
            finished.append(who)
            return response.status_code

        async def main() -> None:
            async with httpx.AsyncClient(timeout=30) as http:
                burst = [asyncio.ensure_future(send(http, gateways[0].url, "noisy", noisy)) for _ in range(10)]
                await asyncio.sleep(0.3)
                assert await send(http, gateways[1].url, "quiet", quiet) == 200
                assert set(await asyncio.gather(*burst)) == {200}

        asyncio.run(main())
    finally:
        for gateway in gateways:
            gateway.stop()
    # The noisy account's own process does not keep the freed slots for its queue while the quiet one's
    # process waits: the quiet request is served within a few turns, not after the whole burst.
    assert finished.index("quiet") <= 5, finished


class _Gateway:
    def __init__(self, env: dict[str, str]) -> None:
        import socket

        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "speedinfer.asgi:application", "--port", str(self.port)]
            + ["--log-level", "warning", "--no-access-log"],
            env=env,
            cwd=ROOT,
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


@pytest.mark.parametrize("value", [0, "4", True, -1, 2.5])
def test_a_bad_max_concurrency_is_refused_naming_the_field(value):
    make_model(model_id=MODEL)
    doc = {
        "worker_id": "w",
        "runtime": "cuda",
        "runtime_endpoint": "http://gpu:8000/v1",
        "supported_models": [MODEL],
        "runtime_config": {"transport": "openai", "max_concurrency": value},
    }
    with pytest.raises(ValidationError) as caught:
        registration_validate(doc)
    assert list(caught.value.message_dict) == ["runtime_config.max_concurrency"]


def test_createapikey_priority(subprocess_env):
    make_account(name="acme")
    ok = subprocess.run(
        [sys.executable, "manage.py", "createapikey", "acme", "--priority", "high"],
        cwd=ROOT,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    from accounts.models import ApiKey

    assert ApiKey.objects.get().priority == "high"
    bad = subprocess.run(
        [sys.executable, "manage.py", "createapikey", "acme", "--priority", "urgent"],
        cwd=ROOT,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "--priority" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert ApiKey.objects.count() == 1


def test_the_prefix_index_is_bounded_and_scoring_is_cheap(monkeypatch):
    monkeypatch.setattr(prefix, "CAPACITY", 1000)
    texts = [SYSTEM.format(n=1), "a question of a few words"]
    for i in range(100):
        prefix.record(prefix.block_hashes(model=MODEL, texts=[f"{i}", *texts]), f"w{i % 4}")
    assert prefix.size() <= 1000
    hashes = prefix.block_hashes(model=MODEL, texts=texts)
    prefix.record(hashes, "w9")
    assert prefix.matches(hashes) == {"w9": len(hashes)}
    timings = []
    for _ in range(200):
        started = time.perf_counter()
        prefix.matches(prefix.block_hashes(model=MODEL, texts=texts))
        timings.append(time.perf_counter() - started)
    assert sorted(timings)[100] < 0.0001  # p50 under 0.1 ms for a 1.6K-character prompt
    assert Counter(prefix.matches(prefix.block_hashes(model="other/model", texts=texts))) == Counter()


def test_a_mixed_pool_prefers_the_capped_worker_with_room_and_spills_to_an_uncapped_one():
    from workers import queue

    async def main() -> list[str]:
        candidates = [("capped", 1), ("open", None)]
        first = await queue.admit(model_id=MODEL, candidates=candidates, account=1, priority="low")
        second = await queue.admit(model_id=MODEL, candidates=candidates, account=1, priority="low")
        first.release()
        await asyncio.sleep(0.1)  # under Redis the slot is given back in the background, one round trip
        third = await queue.admit(model_id=MODEL, candidates=candidates, account=1, priority="low")
        third.release()
        second.release()
        return [first.worker_id, second.worker_id, third.worker_id]

    # Never saturated (an uncapped worker is eligible), so even `low` is served, never refused.
    assert asyncio.run(main()) == ["capped", "open", "capped"]
