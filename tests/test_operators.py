"""What an operator sees: logs once and readable, metrics without gaps, a favicon."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from django.test import Client

from core.outcome import RequestOutcome
from core.request_log import request_log_line
from tests.factories import make_account, make_key, make_model
from tests.servers import register_worker
from tests.test_metrics import samples, value
from workers.circuit import record_failure_sync
from workers.models import Worker

ROOT = Path(__file__).resolve().parent.parent


def test_request_log_ts_is_iso_8601_utc():
    data = json.loads(request_log_line(RequestOutcome(request_id="r", status=200, latency=0.01)))
    assert data["ts"].endswith("Z")
    stamp = datetime.fromisoformat(data["ts"].replace("Z", "+00:00"))
    assert abs(datetime.now(UTC) - stamp) < timedelta(seconds=5)


def test_a_django_warning_is_logged_once(subprocess_env):
    code = (
        "import django; django.setup(); import logging; logging.getLogger('django.request').warning('only-once-marker')"
    )
    env = {**subprocess_env, "DJANGO_SETTINGS_MODULE": "speedinfer.settings", "DEBUG": "1"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (proc.stdout + proc.stderr).count("only-once-marker") == 1


@pytest.mark.django_db
def test_circuit_open_is_one_warning_not_one_per_probe(caplog, settings):
    settings.SPEEDINFER_CIRCUIT_FAILURE_THRESHOLD = 3
    Worker.objects.create(worker_id="down-1", runtime="cuda", transport="openai", runtime_endpoint="http://127.0.0.1:9")
    with caplog.at_level(logging.DEBUG, logger="speedinfer.circuit"):
        for _ in range(10):
            record_failure_sync("down-1", reason="connection refused")
    warnings = [r for r in caplog.records if r.name == "speedinfer.circuit" and r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in warnings] == [
        "worker down-1 circuit open after 3 consecutive failures (connection refused)"
    ]


@pytest.mark.django_db
def test_metrics_have_no_created_series_and_down_workers_report_models_not_ready():
    Worker.objects.create(
        worker_id="down-2",
        runtime="cuda",
        transport="openai",
        runtime_endpoint="http://127.0.0.1:9",
        supported_models=["acme/a", "acme/b"],
        healthy=False,
        model_readiness={"acme/a": {"ready": True}},  # stale readiness from before it went down
    )
    text = Client().get("/metrics").content.decode()
    assert "_created" not in text
    found = samples(text)
    for model in ("acme/a", "acme/b"):
        key = ("speedinfer_worker_model_ready", (("model", model), ("worker", "down-2")))
        assert found[key] == 0.0


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_gateway")
def test_credits_spent_are_counted_per_model(gateway_server, simulator):
    make_model(model_id="acme/model-1", max_output_tokens=16)
    account = make_account(name="spender", credits=10)
    secret = make_key(account=account).secret
    register_worker(simulator.base_url)
    before = value(
        samples(Client().get("/metrics").content.decode()), "speedinfer_credits_spent_total", model="acme/model-1"
    )
    response = httpx.post(
        gateway_server.url + "/v1/chat/completions",
        json={"model": "acme/model-1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        headers={"Authorization": f"Bearer {secret}"},
        timeout=30,
    )
    assert response.status_code == 200
    account.refresh_from_db()
    spent = (10 * 1_000_000 - account.available) / 1_000_000
    assert spent > 0
    metrics = httpx.get(gateway_server.url + "/metrics", timeout=10).text
    after = value(samples(metrics), "speedinfer_credits_spent_total", model="acme/model-1")
    # The gateway server may run in this process or its own; either way the spend shows.
    assert after - before == pytest.approx(spent) or after == pytest.approx(spent)


def test_favicon_is_served():
    response = Client().get("/favicon.ico")
    assert response.status_code == 200
    assert b"".join(response.streaming_content)[:4] == b"\x00\x00\x01\x00"  # type: ignore[attr-defined]
