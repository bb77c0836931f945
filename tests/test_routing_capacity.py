"""Capacity-aware routing: two simulator workers for one model, one four times slower, through the gateway.

The simulators serve a bounded batch (max_concurrency), so a worker's latency grows with its load as a
GPU's does: the fast one answers in 20 ms, four at a time (a large GPU), the slow one in 80 ms, one at a
time (a small one). The slow one's queue makes random choice's tail long even on a loaded test machine.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from aiohttp import web
from django.core.exceptions import ValidationError
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from devtools.simulator import Behaviour, Simulator, SimulatorThread
from tests.factories import make_account, make_key, make_model
from tests.servers import register_worker
from workers import balancer, fleet
from workers.load import parse_load
from workers.models import Worker
from workers.registration import registration_validate

MODEL = "acme/model-1"


class BusySimulator(Simulator):
    """A runtime whose metrics endpoint says 50 requests wait in its own queue (another tenant's load)."""

    async def metrics(self, request: web.Request) -> web.Response:
        text = "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 50\n"
        text += "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 8\n"
        return web.Response(text=text, content_type="text/plain")


def _start(simulator: Simulator) -> SimulatorThread:
    return SimulatorThread(simulator).start()


@pytest.fixture
def pair(gateway_server: Any) -> Iterator[dict[str, Any]]:
    """fast (20 ms, four at a time) and slow (80 ms, one at a time), registered with their metrics URLs."""
    yield from _pair(gateway_server, slow_ms=80)


@pytest.fixture
def far_pair(gateway_server: Any) -> Iterator[dict[str, Any]]:
    """fast (20 ms) and one far slower (250 ms): a fast answer slowed by a loaded test machine (seen at
    80+ ms under CI's two xdist workers) is still not mistaken for the slow worker's pace."""
    yield from _pair(gateway_server, slow_ms=250)


def _pair(gateway_server: Any, *, slow_ms: int) -> Iterator[dict[str, Any]]:
    fast = _start(Simulator(behaviour=Behaviour(latency_ms=20, deltas=4), max_concurrency=4))
    slow = _start(Simulator(behaviour=Behaviour(latency_ms=slow_ms, deltas=4), max_concurrency=1))
    make_model(model_id=MODEL, max_output_tokens=16)
    secret = make_key(account=make_account(name="router", credits=1000)).secret
    for name, sim in (("fast", fast), ("slow", slow)):
        register_worker(sim.base_url, worker_id=name, metrics_url=f"http://127.0.0.1:{sim.port}/metrics")
    balancer.forget()
    yield {"fast": fast, "slow": slow, "secret": secret, "url": gateway_server.url}
    balancer.forget()
    fast.stop()
    slow.stop()


def _run(world: dict[str, Any], *, concurrency: int, per_client: int) -> tuple[dict[str, int], list[float]]:
    """Closed-loop clients through the gateway; returns the requests each simulator answered, and latencies."""
    before = {name: world[name].simulator.stats.completed for name in ("fast", "slow")}
    latencies: list[float] = []
    statuses: list[int] = []

    async def client(http: httpx.AsyncClient) -> None:
        for _ in range(per_client):
            started = time.perf_counter()
            response = await http.post(
                "/v1/chat/completions",
                json={"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]},
            )
            latencies.append(time.perf_counter() - started)
            statuses.append(response.status_code)

    async def main() -> None:
        headers = {"Authorization": f"Bearer {world['secret']}"}
        limits = httpx.Limits(max_connections=concurrency)
        async with httpx.AsyncClient(base_url=world["url"], headers=headers, timeout=30, limits=limits) as http:
            await asyncio.gather(*(client(http) for _ in range(concurrency)))

    asyncio.run(main())
    assert set(statuses) == {200}
    return {name: world[name].simulator.stats.completed - before[name] for name in before}, latencies


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def _share(split: dict[str, int], name: str) -> float:
    return split[name] / sum(split.values())


pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_gateway")]


def test_at_16_concurrent_the_fast_worker_takes_most_and_p99_beats_random(pair, settings):
    _run(pair, concurrency=4, per_client=3)  # warm: connections, caches, a first latency for each worker
    split, latencies = _run(pair, concurrency=16, per_client=16)
    settings.SPEEDINFER_ROUTING_POLICY = "random"
    balancer.forget()
    random_split, random_latencies = _run(pair, concurrency=16, per_client=16)
    print(
        f"\nc16 least-loaded: fast {_share(split, 'fast'):.0%} p99 {_p99(latencies) * 1000:.0f} ms | "
        f"random: fast {_share(random_split, 'fast'):.0%} p99 {_p99(random_latencies) * 1000:.0f} ms"
    )
    assert _share(split, "fast") >= 0.7
    assert 0.3 <= _share(random_split, "fast") <= 0.7
    assert _p99(latencies) < _p99(random_latencies)


def test_one_request_at_a_time_goes_to_the_fast_worker(far_pair):
    # Until both are observed an unobserved worker borrows the other's estimate (tried once or twice).
    for _ in range(50):
        if all(far_pair[name].simulator.stats.completed for name in ("fast", "slow")):
            break
        _run(far_pair, concurrency=1, per_client=1)
    split, _ = _run(far_pair, concurrency=1, per_client=30)
    # Random choice splits this ~50/50.
    assert split["fast"] >= 27, split


def test_a_runtime_with_50_requests_waiting_gets_little_traffic(gateway_server):
    idle = _start(Simulator(behaviour=Behaviour(latency_ms=20, deltas=4)))
    busy = _start(BusySimulator(behaviour=Behaviour(latency_ms=20, deltas=4)))
    try:
        make_model(model_id=MODEL, max_output_tokens=16)
        secret = make_key(account=make_account(name="router", credits=1000)).secret
        for name, sim in (("fast", idle), ("slow", busy)):
            register_worker(sim.base_url, worker_id=name, metrics_url=f"http://127.0.0.1:{sim.port}/metrics")
        stored = Worker.objects.get(worker_id="slow")
        assert (stored.runtime_queue, stored.runtime_running) == (50, 8)
        assert Worker.objects.get(worker_id="fast").runtime_queue == 0
        balancer.forget()
        world = {"fast": idle, "slow": busy, "secret": secret, "url": gateway_server.url}
        one, _ = _run(world, concurrency=1, per_client=20)
        many, _ = _run(world, concurrency=16, per_client=6)
        assert one["slow"] <= 1, one
        assert many["slow"] <= 0.1 * sum(many.values()), many
        metrics = Client().get("/metrics").content.decode()
        queues = {
            s.labels["worker"]: s.value
            for f in text_string_to_metric_families(metrics)
            for s in f.samples
            if s.name == "speedinfer_worker_runtime_queue"
        }
        assert queues == {"fast": 0.0, "slow": 50.0}
    finally:
        balancer.forget()
        idle.stop()
        busy.stop()


def test_requests_another_gateway_process_has_in_flight_count_across_processes(pair):
    """Another process (as Redis tells it) has 40 requests on the fast worker: this one sends its own to the
    slow one, and its /metrics shows the fleet's count."""
    import redis.asyncio as aioredis
    from django.conf import settings

    _run(pair, concurrency=1, per_client=4)  # both observed; the fleet sync task runs on the gateway's loop
    stop = asyncio.Event()

    async def other_process() -> None:
        async with aioredis.Redis.from_url(settings.REDIS_URL) as client:
            while not stop.is_set():
                await fleet.sync_once(client, process="other-gateway", counts={"fast": 40}, known=[])
                await asyncio.sleep(0.1)
            await client.delete(fleet.process_key("other-gateway"))

    async def main() -> dict[str, int]:
        publisher = asyncio.create_task(other_process())
        await asyncio.sleep(1.0)  # two sync periods: the gateway has read the other process's counts
        split = await asyncio.to_thread(lambda: _run(pair, concurrency=1, per_client=10)[0])
        text = await asyncio.to_thread(lambda: Client().get("/metrics").content.decode())
        stop.set()
        await publisher
        flying = {
            s.labels["worker"]: s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == "speedinfer_worker_in_flight"
        }
        assert flying["fast"] == 40.0
        return split

    split = asyncio.run(main())
    assert split["slow"] >= 9, split


def test_the_admin_shows_the_load(pair, django_user_model):
    # The slow worker needs a latency estimate to show: load until it has served a request (an idle fast
    # worker is preferred, so a light run may send it none).
    for _ in range(10):
        split, _ = _run(pair, concurrency=4, per_client=3)
        if pair["slow"].simulator.stats.completed:
            break
    assert pair["slow"].simulator.stats.completed, split
    Worker.objects.filter(worker_id="slow").update(runtime_queue=7)
    django_user_model.objects.create_superuser(username="admin", email="a@example.com", password="pw-12345678")
    staff = Client()
    assert staff.login(username="admin", password="pw-12345678")
    page = staff.get(f"/admin/workers/worker/{Worker.objects.get(worker_id='slow').pk}/change/").content.decode()
    assert "7 queued" in page
    assert "latency ~" in page
    listing = staff.get("/admin/workers/worker/").content.decode()
    assert "0 in flight" in listing


TRITON_TEXT = """# HELP nv_inference_pending_request_count Instantaneous number of pending requests
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="text_generation",version="1"} 3
nv_inference_pending_request_count{model="other",version="1"} 40
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{model="text_generation",version="1"} 9000000
nv_inference_queue_duration_us{model="other",version="1"} 1
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="text_generation",version="1"} 1000
nv_inference_request_success{model="other",version="1"} 1
"""

TRT_LLM_TEXT = """# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 5
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="context",version="1"} 1
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 7
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 64
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 12
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 400
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 100
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="free",model="tensorrt_llm",version="1"} 300
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="ensemble",version="1"} 2
"""

VLLM_TEXT = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="acme/model-1"} 9
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="acme/model-1"} 4
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="acme/model-1"} 0.5
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_sum{model_name="acme/model-1"} 12.0
vllm:request_queue_time_seconds_count{model_name="acme/model-1"} 100
"""


def test_the_runtimes_published_load_is_read():
    triton = parse_load(TRITON_TEXT, model_name="text_generation", previous={"queue_s": 4.0, "done": 500})
    assert (triton.queue, triton.running) == (3, None)  # the worker's own model, not the other one
    assert triton.queue_time_ms == pytest.approx(10.0)  # (9 s - 4 s) over 500 requests finished since
    trt = parse_load(TRT_LLM_TEXT, model_name="ensemble")
    assert (trt.queue, trt.running, trt.max_running, trt.kv_cache_usage) == (5, 12, 64, 0.25)
    assert trt.queue_time_ms is None  # no counters
    vllm = parse_load(VLLM_TEXT, previous={"queue_s": 2.0, "done": 50})
    assert (vllm.queue, vllm.running, vllm.kv_cache_usage) == (4, 9, 0.5)
    assert vllm.queue_time_ms == pytest.approx(200.0)
    restarted = parse_load(VLLM_TEXT, previous={"queue_s": 99.0, "done": 5000})
    assert restarted.queue_time_ms is None
    with pytest.raises(ValueError):
        parse_load("this is { not prometheus")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://gpu:8002/metrics", "http:// or https://"),
        ("http://user:pw@gpu:8002/metrics", "credentials"),
        ("http://gpu:8002/metrics?x=1", "query"),
        (42, "non-empty string"),
    ],
)
def test_a_bad_metrics_url_is_refused_naming_the_field(url, message):
    make_model(model_id=MODEL)
    doc = {
        "worker_id": "w",
        "runtime": "cuda",
        "runtime_endpoint": "http://gpu:8000/v1",
        "supported_models": [MODEL],
        "runtime_config": {"transport": "openai", "metrics_url": url},
    }
    with pytest.raises(ValidationError) as caught:
        registration_validate(doc)
    errors = caught.value.message_dict
    assert list(errors) == ["runtime_config.metrics_url"]
    assert message in errors["runtime_config.metrics_url"][0]


def test_the_score_prefers_the_worker_expected_to_answer_soonest():
    balancer.forget()
    try:
        balancer.observe("fast", 0.020)
        balancer.observe("slow", 0.080)

        def first(**in_flight: int) -> str:
            return balancer.order([balancer.Candidate(w, n) for w, n in in_flight.items()])[0].worker_id

        assert first(fast=0, slow=0) == "fast"  # idle fast beats idle slow
        assert first(fast=4, slow=0) == "slow"  # busy fast (0.02 x 5) yields to idle slow (0.08 x 1)
        queued = [balancer.Candidate("fast", 0, queue=50), balancer.Candidate("slow", 0)]
        assert balancer.order(queued)[0].worker_id == "slow"  # the runtime's own queue counts
        assert {first(a=0, b=0) for _ in range(50)} == {"a", "b"}  # ties at random
        balancer.note_failure("fast")
        assert first(fast=0, slow=9) == "slow"  # just failed: after every worker that did not
        balancer.forget()
        for name, latency in (("w1", 0.01), ("w2", 0.02), ("w3", 0.03), ("w4", 0.04)):
            balancer.observe(name, latency)
        orders = [[c.worker_id for c in balancer.order([balancer.Candidate(w, 0) for w in ("w4", "w3", "w2", "w1")])]]
        orders += [
            [c.worker_id for c in balancer.order([balancer.Candidate(w, 0) for w in ("w1", "w2", "w3", "w4")])]
            for _ in range(200)
        ]
        # Two choices: never the costliest first, mostly the cheapest; the rest by cost for the fallback.
        assert {o[0] for o in orders} <= {"w1", "w2", "w3"}
        assert sum(o[0] == "w1" for o in orders) > len(orders) / 3
        assert all(o[1:] == sorted(o[1:]) for o in orders)
    finally:
        balancer.forget()
