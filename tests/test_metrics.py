"""GET /metrics and the per-request JSON log line."""

from __future__ import annotations

import json
import logging

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from billing.services import credits_reserve
from core.credits import MICRO
from core.metrics import observe_request
from core.outcome import RequestOutcome
from core.request_log import log_request, request_log_line
from tests.factories import make_account, make_model
from workers.models import Worker


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def value(found, name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.mark.django_db
def test_it_counts_requests_latency_ttft_and_tokens():
    before = samples(Client().get("/metrics").content.decode())
    observe_request(
        RequestOutcome(
            request_id="t",
            endpoint="chat",
            model="acme/metrics-a",
            worker_id="gpu-a",
            status=200,
            latency=0.3,
            ttft=0.04,
            prompt_tokens=11,
            completion_tokens=7,
        )
    )
    observe_request(
        RequestOutcome(
            request_id="t", endpoint="chat", model="acme/metrics-a", worker_id="gpu-a", status=502, latency=2.5
        )
    )
    response = Client().get("/metrics")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    after = samples(response.content.decode())

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    labels = {"endpoint": "chat", "model": "acme/metrics-a", "worker": "gpu-a"}
    assert delta("speedinfer_requests_total", **labels, status="200") == 1
    assert delta("speedinfer_requests_total", **labels, status="502") == 1
    assert delta("speedinfer_request_duration_seconds_count", **labels) == 2
    assert delta("speedinfer_request_duration_seconds_bucket", **labels, le="0.5") == 1
    assert delta("speedinfer_time_to_first_token_seconds_count", model="acme/metrics-a", worker="gpu-a") == 1
    assert delta("speedinfer_tokens_total", model="acme/metrics-a", kind="prompt") == 11
    assert delta("speedinfer_tokens_total", model="acme/metrics-a", kind="completion") == 7


@pytest.mark.django_db
def test_labels_stay_bounded():
    """A made-up model name from a rejected request never becomes a label; no ids at all."""
    observe_request(
        RequestOutcome(
            request_id="t", endpoint="chat", model="junk-<random-1234>", worker_id="", status=404, latency=0.001
        )
    )
    text = Client().get("/metrics").content.decode()
    assert "junk-" not in text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            assert not {"key", "user", "request_id", "account", "endpoint_url", "uuid"} & set(s.labels)


@pytest.mark.django_db
def test_it_reports_workers_and_reservations_at_scrape_time():
    Worker.objects.create(
        worker_id="gpu-metrics-1",
        runtime="cuda",
        transport="openai",
        runtime_endpoint="http://10.9.8.7:9000",
        supported_models=["acme/m"],
        healthy=True,
        circuit_state="open",
        model_readiness={"acme/m": {"ready": True}},
        gpu_metadata={"uuid": "GPU-secret-uuid"},
        last_probe_latency_ms=12,
    )
    model = make_model(model_id="acme/m")
    account = make_account(name="Held", credits=10)
    credits_reserve(account_id=account.pk, amount=3 * MICRO, model=model)
    text = Client().get("/metrics").content.decode()
    found = samples(text)
    assert value(found, "speedinfer_worker_healthy", worker="gpu-metrics-1") == 1
    assert value(found, "speedinfer_worker_circuit_state", worker="gpu-metrics-1", state="open") == 1
    assert value(found, "speedinfer_worker_circuit_state", worker="gpu-metrics-1", state="closed") == 0
    assert value(found, "speedinfer_worker_model_ready", worker="gpu-metrics-1", model="acme/m") == 1
    assert value(found, "speedinfer_worker_probe_latency_seconds", worker="gpu-metrics-1") == pytest.approx(0.012)
    assert value(found, "speedinfer_reservations_held") == 1
    assert value(found, "speedinfer_reserved_credits") == 3
    assert "10.9.8.7" not in text and "GPU-secret-uuid" not in text


@pytest.mark.django_db
def test_observe_request_counts_every_call_under_its_own_labels():
    """The hot path keeps each label set's children cached (its cost is in `make bench`): the cache must
    neither drop a call nor let one label set count under another's."""
    before = samples(Client().get("/metrics").content.decode())

    def outcome(worker_id: str, status: int) -> RequestOutcome:
        return RequestOutcome(
            request_id="t",
            endpoint="chat",
            model="acme/fast",
            worker_id=worker_id,
            status=status,
            latency=0.1,
            ttft=0.01,
            prompt_tokens=10,
            completion_tokens=20,
        )

    n = 1000
    for i in range(n):
        observe_request(outcome("gpu-f", 200))
        if i % 10 == 0:
            observe_request(outcome("gpu-g" if i % 20 == 0 else "gpu-f", 502))
    after = samples(Client().get("/metrics").content.decode())

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    f = {"endpoint": "chat", "model": "acme/fast", "worker": "gpu-f"}
    g = {"endpoint": "chat", "model": "acme/fast", "worker": "gpu-g"}
    assert delta("speedinfer_requests_total", **f, status="200") == n
    assert delta("speedinfer_requests_total", **f, status="502") == n // 20
    assert delta("speedinfer_requests_total", **g, status="502") == n // 20
    assert delta("speedinfer_requests_total", **g, status="200") == 0
    assert delta("speedinfer_request_duration_seconds_count", **f) == n + n // 20
    assert delta("speedinfer_request_duration_seconds_bucket", **f, le="0.1") == n + n // 20
    assert delta("speedinfer_time_to_first_token_seconds_count", model="acme/fast", worker="gpu-g") == n // 20
    total = n + n // 10
    assert delta("speedinfer_tokens_total", model="acme/fast", kind="prompt") == 10 * total
    assert delta("speedinfer_tokens_total", model="acme/fast", kind="completion") == 20 * total


def test_request_log_is_one_json_line_without_secrets(caplog):
    with caplog.at_level(logging.INFO, logger="speedinfer.requests"):
        log_request(
            RequestOutcome(
                request_id="req-abc",
                account_id=7,
                key_prefix="sk-si-abcdefabcdef",
                endpoint="chat",
                model="acme/m",
                worker_id="gpu-1",
                status=200,
                latency=0.123,
                ttft=0.045,
                prompt_tokens=10,
                completion_tokens=5,
            )
        )
    records = [r for r in caplog.records if r.name == "speedinfer.requests"]
    assert len(records) == 1
    line = records[0].getMessage()
    assert "\n" not in line
    data = json.loads(line)
    assert data["request_id"] == "req-abc" and data["account"] == 7 and data["model"] == "acme/m"
    assert data["worker"] == "gpu-1" and data["status"] == 200 and data["latency_ms"] == 123
    assert (data["prompt_tokens"], data["completion_tokens"]) == (10, 5)
    assert set(data) >= {"request_id", "account", "model", "worker", "status", "latency_ms", "prompt_tokens"}
    line2 = request_log_line(
        RequestOutcome(request_id="r", account_id=None, endpoint="", model="", worker_id="", status=401, latency=0.001)
    )
    assert json.loads(line2)["account"] is None
