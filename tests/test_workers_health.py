"""Probes and GET /health against the real Triton server and a small real OpenAI-compatible server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import override_settings

from tests.factories import make_model
from workers.models import Worker
from workers.services import worker_register

pytestmark = pytest.mark.django_db
TRITON_CONFIG = {
    "model_name": "text_generation",
    "input_name": "text_input",
    "max_tokens_input_name": "max_tokens",
    "output_name": "text_output",
    "prompt_tokens_output_name": "prompt_tokens",
    "completion_tokens_output_name": "completion_tokens",
}


def register_triton(url: str, worker_id: str = "triton-01", model_name: str = "text_generation") -> Worker:
    make_model(model_id="acme/model-1")
    worker, _ = worker_register(
        data={
            "worker_id": worker_id,
            "worker_type": "nvidia-gpu",
            "runtime": "triton",
            "runtime_endpoint": url,
            "supported_models": ["acme/model-1"],
            "runtime_config": {**TRITON_CONFIG, "model_name": model_name},
            "gpu_metadata": {"product": "H200"},
            "runtime_metadata": {"triton_version": "2.51.0"},
        }
    )
    return worker


def probe() -> str:
    out = StringIO()
    call_command("probeworkers", stdout=out)
    return out.getvalue()


def health(client) -> dict:
    response = client.get("/health")
    assert response.status_code == 200
    return response.json()


@pytest.mark.triton
@override_settings(SPEEDINFER_CIRCUIT_FAILURE_THRESHOLD=1, SPEEDINFER_CIRCUIT_COOLDOWN=0)
def test_health_follows_a_real_triton_server_going_away_and_coming_back(client, triton_factory):
    server = triton_factory()
    register_triton(server.url)
    assert health(client) == {
        "status": "unavailable",
        "workers": [
            {
                "worker_id": "triton-01",
                "runtime": "triton",
                "transport": "triton",
                "healthy": False,
                "circuit": "closed",
                "models": {"acme/model-1": {"ready": False}},
                "last_probe_at": None,
            }
        ],
    }
    assert "triton-01 healthy circuit=closed ready=acme/model-1" in probe()
    body = health(client)
    assert body["status"] == "ok"
    assert body["workers"][0]["healthy"] is True
    assert body["workers"][0]["models"] == {"acme/model-1": {"ready": True}}
    assert body["workers"][0]["last_probe_at"]

    server.stop()
    out = probe()
    assert "triton-01 unhealthy circuit=open" in out
    assert server.url not in out
    body = health(client)
    assert body["status"] == "unavailable"
    assert body["workers"][0]["healthy"] is False
    assert body["workers"][0]["circuit"] == "open"
    assert body["workers"][0]["models"] == {"acme/model-1": {"ready": False}}

    server.start()
    probe()
    body = health(client)
    assert body["status"] == "ok"
    assert body["workers"][0]["healthy"] is True
    assert body["workers"][0]["circuit"] == "closed"  # the probe served as the half-open trial


@pytest.mark.triton
def test_health_is_degraded_with_one_of_two_and_never_shows_endpoints_or_metadata(client, triton_server):
    register_triton(triton_server.url, "triton-ok")
    register_triton(triton_server.url, "triton-bad-model", model_name="no_such_model")
    Worker.objects.filter(worker_id="triton-ok").update(upstream_api_key="sk-never-shown")
    out = probe()
    assert "triton-ok healthy" in out
    assert "sk-never-shown" not in out
    worker = Worker.objects.get(worker_id="triton-bad-model")
    assert worker.healthy is True  # the server is up, the declared model is not
    assert worker.model_readiness == {"acme/model-1": False}
    assert "text_generation" in worker.discovered_models
    body = health(client)
    text = json.dumps(body)
    assert body["status"] == "ok"  # both servers are healthy; readiness is per model
    models = {w["worker_id"]: w["models"] for w in body["workers"]}
    assert models == {
        "triton-bad-model": {"acme/model-1": {"ready": False}},
        "triton-ok": {"acme/model-1": {"ready": True}},
    }
    for secret in (triton_server.url, "127.0.0.1", "sk-never-shown", "H200", "2.51.0", "runtime_config", "endpoint"):
        assert secret not in text


def test_health_with_no_workers_is_unavailable_and_disabled_workers_are_left_out(client):
    assert health(client) == {"status": "unavailable", "workers": []}
    register_triton("http://127.0.0.1:9")
    Worker.objects.update(enabled=False)
    assert health(client)["workers"] == []


class _OpenAIWorker(BaseHTTPRequestHandler):
    models: list[str] = []
    key = ""

    def do_GET(self) -> None:  # noqa: N802
        if self.key and self.headers.get("Authorization") != f"Bearer {self.key}":
            self._send(401, {"error": {"message": "bad key"}})
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in self.models]})
        else:
            self._send(404, {"error": {"message": "not found"}})

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def openai_worker() -> Iterator[type[_OpenAIWorker]]:
    handler = type("Handler", (_OpenAIWorker,), {"models": ["served/model-a"], "key": "sk-upstream"})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    handler.url = f"http://127.0.0.1:{server.server_address[1]}/v1"  # type: ignore[attr-defined]
    yield handler
    server.shutdown()
    server.server_close()


def register_openai(url: str, **extra) -> Worker:
    make_model(model_id="acme/model-1")
    make_model(model_id="acme/model-2")
    worker, _ = worker_register(
        data={
            "worker_id": "cuda-01",
            "runtime": "cuda",
            "runtime_endpoint": url,
            "supported_models": ["acme/model-1", "acme/model-2"],
            "runtime_config": {"transport": "openai", "model_map": {"acme/model-1": "served/model-a"}},
            **extra,
        }
    )
    return worker


def test_openai_probe_reads_models_through_the_map_with_the_workers_key(client, openai_worker):
    register_openai(openai_worker.url, upstream_api_key="sk-upstream")
    out = probe()
    assert "sk-upstream" not in out
    worker = Worker.objects.get(worker_id="cuda-01")
    assert worker.healthy is True
    assert worker.model_readiness == {"acme/model-1": True, "acme/model-2": False}
    assert "acme/model-2" in worker.last_probe_error
    assert health(client)["workers"][0]["models"] == {
        "acme/model-1": {"ready": True},
        "acme/model-2": {"ready": False},
    }


def test_openai_probe_without_the_key_is_unhealthy_but_not_a_circuit_failure(openai_worker):
    register_openai(openai_worker.url)
    probe()
    worker = Worker.objects.get(worker_id="cuda-01")
    assert worker.healthy is False
    assert "401" in worker.last_probe_error
    assert worker.consecutive_failures == 0  # a 4xx is not a worker fault


def test_probe_of_an_unreachable_worker_counts_against_its_circuit():
    register_openai("http://127.0.0.1:9/v1")
    probe()
    worker = Worker.objects.get(worker_id="cuda-01")
    assert worker.healthy is False
    assert worker.consecutive_failures == 1
    assert worker.last_probe_error.startswith("upstream_error")
    assert "127.0.0.1" not in worker.last_probe_error
