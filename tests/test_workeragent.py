"""`manage.py workeragent`: a GPU host registers its worker through the staff API, NVML faked at pynvml.

The SpeedInfer is real (pytest-django's live_server serves /api/); NVML is faked by replacing the
`pynvml` module's functions, and the fake hands out a serial and a UUID too, which must never reach it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.factories import make_account, make_key, make_model
from workers.agent import agent_report_state
from workers.gpu import gpu_read
from workers.models import Worker
from workers.registration import registration_validate

ROOT = Path(__file__).resolve().parent.parent
SERIAL = "1652020012345"
UUIDS = ("GPU-5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a", "GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d")
# A process whose database and Redis are unreachable: a query or a Redis call would fail it.
NO_DATABASE = {
    "DATABASE_URL": "postgres://nobody@127.0.0.1:1/unreachable",
    "REDIS_URL": "redis://127.0.0.1:1/0",
    "SECRET_KEY": "agent-host-secret",
    "DEBUG": "0",
    "ALLOWED_HOSTS": "*",
    "PYTHONUNBUFFERED": "1",
}


class FakeNvml:
    """Two H200s as NVML describes them, including what must never be published."""

    def __init__(self) -> None:
        self.utilization = [7, 93]
        self.used_mib = [1024, 70000]

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        handles = [SimpleNamespace(index=i) for i in range(2)]
        patches: dict[str, Any] = {
            "nvmlInit": lambda: None,
            "nvmlShutdown": lambda: None,
            "nvmlDeviceGetCount": lambda: 2,
            "nvmlDeviceGetHandleByIndex": lambda i: handles[i],
            "nvmlDeviceGetName": lambda h: "NVIDIA H200",
            "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(
                total=143771 * 1024 * 1024, used=self.used_mib[h.index] * 1024 * 1024, free=0
            ),
            "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=self.utilization[h.index], memory=3),
            "nvmlSystemGetDriverVersion": lambda: "580.159.04",
            "nvmlSystemGetCudaDriverVersion": lambda: 13000,
            "nvmlSystemGetCudaDriverVersion_v2": lambda: 13000,
            "nvmlDeviceGetUUID": lambda h: UUIDS[h.index],
            "nvmlDeviceGetSerial": lambda h: SERIAL,
        }
        for name, function in patches.items():
            monkeypatch.setattr(pynvml, name, function)


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml()
    fake.install(monkeypatch)
    return fake


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", missing)


def _assert_no_identity(text: str) -> None:
    assert SERIAL not in text
    for uuid in UUIDS:
        assert uuid not in text and uuid[4:] not in text
    assert "serial" not in text.lower() and "uuid" not in text.lower()


def test_nvml_gives_product_count_memory_versions_and_live_figures_never_the_identity(fake_nvml, db):
    make_model(model_id="acme/model-1")
    reading = gpu_read()
    meta = reading.metadata
    assert reading.reason == ""
    assert meta["product"] == "NVIDIA H200" and meta["count"] == 2
    assert meta["memory_total_mib"] == 2 * 143771 and meta["memory_used_mib"] == 71024
    assert meta["driver_version"] == "580.159.04" and meta["cuda_driver_version"] == "13.0"
    assert meta["utilization_percent"] == 50
    assert [g["utilization_percent"] for g in meta["gpus"]] == [7, 93]
    _assert_no_identity(json.dumps(meta))
    # What the agent sends passes the registration's own serial/UUID refusal.
    registration_validate(_doc("http://127.0.0.1:9/v1") | {"gpu_metadata": meta})


def test_without_nvml_there_is_no_metadata_and_a_reason(no_gpu):
    reading = gpu_read()
    assert reading.metadata == {}
    assert "NVML is not available" in reading.reason


def _doc(endpoint: str, **extra: Any) -> dict[str, Any]:
    return {
        "worker_id": "gpu-host-1",
        "worker_type": "nvidia-gpu",
        "runtime": "cuda",
        "runtime_endpoint": endpoint,
        "supported_models": ["acme/model-1"],
        "runtime_config": {"transport": "openai"},
        "runtime_metadata": {"cuda_version": "13.0"},
        # Typed by an operator: the agent replaces it with what NVML says.
        "gpu_metadata": {"product": "operator-reported"},
        **extra,
    }


@pytest.fixture
def fleet(transactional_db, simulator, tmp_path) -> SimpleNamespace:
    """A registered model, an admin-scope key, a local runtime (the simulator) and its registration file."""
    make_model(model_id="acme/model-1")
    account = make_account(name="operators")
    admin_key = make_key(account=account, name="agent", scopes=["admin"]).secret
    chat_key = make_key(account=account, name="chat").secret
    path = tmp_path / "worker.json"
    path.write_text(json.dumps(_doc(simulator.base_url)))
    return SimpleNamespace(admin_key=admin_key, chat_key=chat_key, file=str(path))


def _agent(live_server: Any, fleet: SimpleNamespace, *args: str) -> str:
    from io import StringIO

    out = StringIO()
    call_command("workeragent", "--api", live_server.url, "--key", fleet.admin_key, fleet.file, *args, stdout=out)
    return out.getvalue()


def _api_worker(client: Any, fleet: SimpleNamespace) -> dict[str, Any]:
    response = client.get("/api/workers/gpu-host-1/", HTTP_AUTHORIZATION=f"Bearer {fleet.admin_key}")
    assert response.status_code == 200
    return response.json()


def test_the_agent_registers_then_updates_its_worker_through_the_api(
    live_server, fleet, fake_nvml, client, django_assert_num_queries
):
    # The agent's own process makes no query at all (the live server answers on its own connections).
    with django_assert_num_queries(0):
        first = _agent(live_server, fleet, "--once")
    assert "created worker gpu-host-1" in first and "runtime ready" in first and "2 x NVIDIA H200" in first
    doc = _api_worker(client, fleet)
    assert doc["gpu_metadata"]["product"] == "NVIDIA H200"
    assert doc["gpu_metadata"]["count"] == 2
    assert doc["gpu_metadata"]["utilization_percent"] == 50
    assert doc["runtime_metadata"]["cuda_version"] == "13.0"  # the file's own metadata is kept
    agent = doc["runtime_metadata"]["agent"]
    assert agent["runtime_ready"] is True and agent["interval"] == 30
    assert doc["status"]["agent"]["stale"] is False

    fake_nvml.utilization = [100, 100]
    with django_assert_num_queries(0):
        second = _agent(live_server, fleet, "--once", "--interval", "5")
    assert "updated worker gpu-host-1" in second
    doc = _api_worker(client, fleet)
    assert doc["gpu_metadata"]["utilization_percent"] == 100
    assert doc["runtime_metadata"]["agent"]["interval"] == 5
    assert Worker.objects.count() == 1
    stored = Worker.objects.get()
    _assert_no_identity(json.dumps([stored.gpu_metadata, stored.runtime_metadata]))
    _assert_no_identity(json.dumps(doc))


def test_a_worker_whose_agent_stopped_reporting_shows_as_stale(live_server, fleet, fake_nvml, admin_client):
    _agent(live_server, fleet, "--once", "--interval", "10")
    listing = admin_client.get("/admin/workers/worker/").content.decode()
    assert "last report" in listing and "stale" not in listing
    worker = Worker.objects.get()
    quiet_since = datetime.now(UTC) - timedelta(seconds=45)
    worker.runtime_metadata["agent"]["reported_at"] = quiet_since.isoformat()
    worker.save()
    assert "stale: last report 45 s ago" in admin_client.get("/admin/workers/worker/").content.decode()
    status = admin_client.get("/api/workers/gpu-host-1/").json()["status"]["agent"]
    assert status["stale"] is True and status["age_s"] >= 45
    state = agent_report_state(runtime_metadata=worker.runtime_metadata, now=quiet_since + timedelta(seconds=30))
    assert state is not None and not state.stale


def test_without_a_gpu_it_registers_without_gpu_metadata_and_says_so(live_server, fleet, no_gpu, client):
    out = _agent(live_server, fleet, "--once")
    assert "no GPU metadata: NVML is not available" in out
    assert "created worker gpu-host-1" in out
    doc = _api_worker(client, fleet)
    assert doc["gpu_metadata"] == {}  # not the operator-typed product either
    assert doc["runtime_metadata"]["agent"]["gpu"] == "none"


def test_a_runtime_that_is_down_is_reported_not_ready(live_server, fleet, no_gpu, client, tmp_path):
    path = tmp_path / "down.json"
    path.write_text(json.dumps(_doc("http://127.0.0.1:9/v1")))
    fleet.file = str(path)
    out = _agent(live_server, fleet, "--once")
    assert "runtime not ready (unreachable (ConnectError))" in out
    assert _api_worker(client, fleet)["status"]["agent"]["runtime_ready"] is False


def test_a_registration_the_server_refuses_is_one_line_naming_the_field(live_server, fleet, no_gpu, tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_doc("http://127.0.0.1:9/v1", supported_models=["acme/unregistered"])))
    fleet.file = str(path)
    with pytest.raises(CommandError, match=r"refused the registration: .*supported_models"):
        _agent(live_server, fleet, "--once")


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - our own manage.py with test arguments
        [sys.executable, "manage.py", "workeragent", *args],
        cwd=ROOT,
        env={**os.environ, **NO_DATABASE, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_it_runs_with_only_the_api_url_and_key_no_database_no_redis(live_server, fleet, client):
    result = _run("--api", live_server.url, "--key", fleet.admin_key, fleet.file, "--once")
    assert result.returncode == 0, result.stderr
    assert "created worker gpu-host-1" in result.stdout
    assert _api_worker(client, fleet)["runtime_metadata"]["agent"]["runtime_ready"] is True
    assert fleet.admin_key not in result.stdout + result.stderr


def test_a_refused_key_exits_1_with_one_line(live_server, fleet):
    for key in ("sk-not-a-key", fleet.chat_key):  # unknown; known but without the admin scope
        result = _run("--api", live_server.url, "--key", key, fleet.file)
        assert result.returncode == 1
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "refused the key" in lines[0], result.stderr
        assert key not in result.stderr
    assert not Worker.objects.exists()


def test_an_unreachable_speedinfer_once_exits_1_with_one_line(tmp_path):
    path = tmp_path / "worker.json"
    path.write_text(json.dumps(_doc("http://127.0.0.1:9/v1")))
    result = _run("--api", "http://127.0.0.1:9", "--key", "sk-anything", str(path), "--once")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "CommandError: cannot reach the SpeedInfer at http://127.0.0.1:9: ConnectError"
    ]


def test_bad_arguments_exit_1_naming_them_and_help_works(tmp_path):
    path = tmp_path / "worker.json"
    path.write_text("{not json")
    cases = [
        (["--api", "ftp://x", "--key", "k", str(path)], "--api"),
        (["--api", "http://x", str(path)], "--key"),
        (["--api", "http://x", "--key", "k", "--interval", "0", str(path)], "--interval"),
        (["--api", "http://x", "--key", "k", str(path)], "not valid JSON"),
    ]
    for args, named in cases:
        result = _run(*args, env={"SPEEDINFER_AGENT_KEY": ""})
        assert result.returncode == 1, result
        assert len(result.stderr.strip().splitlines()) == 1 and named in result.stderr
    result = _run("--help")
    assert result.returncode == 0 and "--interval SECONDS" in result.stdout and "admin-scope" in result.stdout


def test_network_errors_in_the_loop_are_one_line_each_and_the_next_report_recovers(live_server, fleet, no_gpu):
    import threading
    import time

    from workers.agent import WorkerAgent, registration_load

    out: list[str] = []
    err: list[str] = []
    agent = WorkerAgent(
        api="http://127.0.0.1:9",
        key=fleet.admin_key,
        doc=registration_load(fleet.file),
        interval=0.2,
        out=out.append,
        err=err.append,
    )
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while len(err) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert thread.is_alive()
    assert (
        err[:2]
        == ["report failed, retrying in 0.2 s: cannot reach the SpeedInfer at http://127.0.0.1:9: ConnectError"] * 2
    )
    agent.api = live_server.url  # the SpeedInfer comes back
    while not Worker.objects.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    agent.stop.set()
    thread.join(5)
    assert Worker.objects.filter(worker_id="gpu-host-1").exists()
    assert any(line.startswith("created worker gpu-host-1") for line in out)
