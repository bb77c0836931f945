"""Circuit transitions shared through the database, and worker selection from the per-process snapshot."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from django.test import override_settings

from tests.factories import make_model
from workers import circuit, routing
from workers.models import Worker
from workers.services import worker_register

ROOT = Path(__file__).resolve().parent.parent


def close_connection() -> None:
    connection.close()  # resolved in the calling thread: the sync_to_async thread's own connection


def arun(coro):
    """asyncio.run, then close the connection the sync_to_async thread opened (it would outlive the test DB)."""

    async def run_and_close():
        try:
            return await coro
        finally:
            await sync_to_async(close_connection)()

    return asyncio.run(run_and_close())


def make_worker(worker_id: str, *, healthy: bool = True, ready: bool = True, model: str = "acme/model-1") -> Worker:
    make_model(model_id=model)
    worker, _ = worker_register(
        data={
            "worker_id": worker_id,
            "runtime": "cuda",
            "runtime_endpoint": f"http://{worker_id}.invalid/v1",
            "supported_models": [model],
            "runtime_config": {"transport": "openai"},
        }
    )
    Worker.objects.filter(pk=worker.pk).update(healthy=healthy, model_readiness={model: ready})
    return worker


def state(worker_id: str) -> str:
    return Worker.objects.get(worker_id=worker_id).circuit_state


def eligible(model: str = "acme/model-1") -> list[str]:
    routing.invalidate()
    return [w.worker_id for w in arun(routing.eligible_workers(model))]


@pytest.fixture(autouse=True)
def _fresh_snapshot():
    routing.invalidate()
    yield
    routing.invalidate()


@pytest.mark.django_db
@override_settings(SPEEDINFER_CIRCUIT_FAILURE_THRESHOLD=3, SPEEDINFER_CIRCUIT_COOLDOWN=0.3)
def test_closed_open_half_open_closed():
    make_worker("w1")
    circuit.record_failure_sync("w1", reason="timeout")
    circuit.record_failure_sync("w1", reason="timeout")
    assert state("w1") == "closed"
    circuit.record_success_sync("w1")  # not consecutive any more
    circuit.record_failure_sync("w1", reason="timeout")
    circuit.record_failure_sync("w1", reason="connect")
    assert state("w1") == "closed"
    circuit.record_failure_sync("w1", reason="502")
    assert state("w1") == "open"
    assert Worker.objects.get(worker_id="w1").last_failure_reason == "502"
    assert circuit.claim_trial_sync("w1") is False  # still cooling down
    circuit.record_success_sync("w1")  # a request begun before it opened does not close it
    assert state("w1") == "open"
    time.sleep(0.35)
    assert circuit.claim_trial_sync("w1") is True
    assert state("w1") == "half_open"
    assert circuit.claim_trial_sync("w1") is False  # exactly one trial
    circuit.record_failure_sync("w1", reason="trial failed")
    assert state("w1") == "open"  # a failed trial re-opens at once
    time.sleep(0.35)
    assert circuit.claim_trial_sync("w1") is True
    circuit.record_success_sync("w1")
    worker = Worker.objects.get(worker_id="w1")
    assert (worker.circuit_state, worker.consecutive_failures) == ("closed", 0)


@pytest.mark.django_db
@override_settings(SPEEDINFER_CIRCUIT_FAILURE_THRESHOLD=1, SPEEDINFER_CIRCUIT_COOLDOWN=60)
def test_reset_closes_an_open_circuit():
    make_worker("w1")
    circuit.record_failure_sync("w1", reason="x")
    assert state("w1") == "open"
    circuit.reset_sync("w1")
    assert state("w1") == "closed"


_CLAIM = """
import os, sys, time, django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "speedinfer.settings")
django.setup()
from workers.circuit import claim_trial_sync
start = float(sys.argv[1])
time.sleep(max(0.0, start - time.time()))
print("WON" if claim_trial_sync("racer") else "LOST", flush=True)
"""


@pytest.mark.django_db(transaction=True)
def test_processes_racing_for_the_half_open_trial_exactly_one_wins(subprocess_env):
    make_worker("racer")
    Worker.objects.filter(worker_id="racer").update(circuit_state="open", circuit_opened_at="2000-01-01T00:00:00Z")
    start = time.time() + 3.0  # every process is set up and waiting by then
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CLAIM, str(start)],
            cwd=ROOT,
            env={**subprocess_env, "SPEEDINFER_CIRCUIT_COOLDOWN": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outcomes = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        outcomes.append(out.strip())
    assert sorted(outcomes) == ["LOST", "LOST", "LOST", "WON"]
    assert state("racer") == "half_open"


@pytest.mark.django_db(transaction=True)
def test_only_enabled_healthy_ready_declaring_closed_workers_are_eligible():
    make_worker("ok")
    make_worker("unhealthy", healthy=False)
    make_worker("not-ready", ready=False)
    make_worker("other-model", model="acme/model-2")
    make_worker("disabled")
    Worker.objects.filter(worker_id="disabled").update(enabled=False)
    make_worker("open")
    Worker.objects.filter(worker_id="open").update(circuit_state="open", circuit_opened_at="2999-01-01T00:00:00Z")
    assert eligible() == ["ok"]
    assert eligible("acme/model-2") == ["other-model"]
    assert eligible("acme/nothing") == []
    assert routing.model_transports("acme/model-1") == {"openai"}


@pytest.mark.django_db(transaction=True)
@override_settings(SPEEDINFER_CIRCUIT_COOLDOWN=0)
def test_a_cooled_down_worker_is_offered_once_as_the_trial_then_closes_on_success():
    make_worker("a")
    make_worker("b")
    Worker.objects.filter(worker_id="b").update(circuit_state="open", circuit_opened_at="2000-01-01T00:00:00Z")

    async def two_requests() -> tuple[list[str], list[str]]:
        first = [w.worker_id for w in await routing.eligible_workers("acme/model-1")]
        second = [w.worker_id for w in await routing.eligible_workers("acme/model-1")]
        return first, second

    first, second = arun(two_requests())
    assert first == ["b", "a"]  # the trial goes first
    assert second == ["a"]  # and only to one request
    assert state("b") == "half_open"
    arun(routing.record_success("b"))
    assert state("b") == "closed"
    assert sorted(eligible()) == ["a", "b"]


@pytest.mark.django_db(transaction=True)
def test_least_in_flight_first():
    make_worker("a")
    make_worker("b")
    routing.acquire("a")
    try:
        assert eligible() == ["b", "a"]
        routing.acquire("b")
        routing.acquire("b")
        assert eligible() == ["a", "b"]
    finally:
        routing.release("a")
        routing.release("b")
        routing.release("b")
    assert routing.in_flight_count("a") == routing.in_flight_count("b") == 0


@pytest.mark.django_db(transaction=True)
@override_settings(SPEEDINFER_ROUTING_CACHE_TTL=60)
def test_selection_reads_the_snapshot_not_the_database_per_request():
    make_worker("a")
    assert eligible() == ["a"]
    Worker.objects.filter(worker_id="a").update(healthy=False)

    async def again() -> list[str]:
        return [w.worker_id for w in await routing.eligible_workers("acme/model-1")]

    assert arun(again()) == ["a"]  # still the snapshot
    routing.invalidate()
    assert arun(again()) == []


@pytest.mark.django_db(transaction=True)
@override_settings(SPEEDINFER_CIRCUIT_FAILURE_THRESHOLD=2, SPEEDINFER_ROUTING_CACHE_TTL=60)
def test_record_success_is_free_when_closed_and_failures_are_counted_by_the_caller():
    make_worker("a")
    assert eligible() == ["a"]
    # Another process's failure, not yet in this process's snapshot: success writes nothing.
    Worker.objects.filter(worker_id="a").update(consecutive_failures=1)
    arun(routing.record_success("a"))
    assert Worker.objects.get(worker_id="a").consecutive_failures == 1
    # This process's own failure is seen at once, and the next success clears it.
    arun(routing.record_failure("a", reason="timeout"))
    assert state("a") == "open"

    async def pick() -> list[str]:
        return [w.worker_id for w in await routing.eligible_workers("acme/model-1")]

    assert arun(pick()) == []
