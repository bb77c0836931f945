"""Writes for workers: registration, enable/disable and recording probe results.

Circuit transitions live in workers.circuit (they are raced for by several
processes and have their own conditional updates).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from core.audit import audit_record
from workers import circuit
from workers.models import Worker
from workers.probes import ProbeResult, probe_target, probe_targets
from workers.registration import WorkerSpec, registration_validate


def _audit(actor: object, action: str, worker: Worker | str, **detail: Any) -> None:
    """Staff changes to workers go to the audit log, in the change's own transaction.

    `actor` empty means a change made by the system itself (the demo's seeding), not audited."""
    if actor:
        audit_record(actor=actor, action=action, target=worker, detail=detail)


def worker_register(*, data: Any, actor: object = "", via: str = "") -> tuple[Worker, bool]:
    """Create or update a worker from its registration JSON; returns (worker, created). Idempotent."""
    spec = registration_validate(data)
    return worker_register_spec(spec=spec, actor=actor, via=via)


@transaction.atomic
def worker_register_spec(*, spec: WorkerSpec, actor: object = "", via: str = "") -> tuple[Worker, bool]:
    worker = Worker.objects.select_for_update().filter(worker_id=spec.worker_id).first()
    created = worker is None
    if worker is None:
        worker = Worker(worker_id=spec.worker_id)
    # Where the worker is or how it is called changed: its last probe says nothing
    # about the new target, so it is not ready until the next probe.
    target_changed = not created and (
        worker.runtime_endpoint != spec.runtime_endpoint
        or worker.runtime_config != spec.runtime_config
        or worker.transport != spec.transport
        or worker.supported_models != spec.supported_models
    )
    # A worker agent re-registers every interval with fresh GPU figures: only a change to the
    # registration itself (not to its reported metadata) is a staff change worth an audit row.
    registration_changed = (
        created
        or target_changed
        or worker.worker_type != spec.worker_type
        or worker.runtime != spec.runtime
        or (spec.upstream_api_key is not None and worker.upstream_api_key != spec.upstream_api_key)
        or (spec.enabled is not None and worker.enabled != spec.enabled)
    )
    worker.worker_type = spec.worker_type
    worker.runtime = spec.runtime
    worker.transport = spec.transport
    worker.runtime_endpoint = spec.runtime_endpoint
    worker.supported_models = spec.supported_models
    worker.runtime_config = spec.runtime_config
    worker.runtime_metadata = spec.runtime_metadata
    worker.gpu_metadata = spec.gpu_metadata
    if spec.upstream_api_key is not None:
        worker.upstream_api_key = spec.upstream_api_key
    if spec.enabled is not None:
        worker.enabled = spec.enabled
    if target_changed:
        worker.healthy = False
        worker.model_readiness = {}
    # Django's URLValidator refuses single-label hosts such as the spec's http://triton:8000;
    # registration_validate has already checked the URL.
    worker.full_clean(exclude=["runtime_endpoint"])
    worker.save()
    if not registration_changed:
        return worker, created
    # Never the endpoint's credential; the endpoint itself stays out too, like everywhere it is shown.
    _audit(
        actor,
        "worker.register" if created else "worker.update",
        worker,
        via=via,
        runtime=worker.runtime,
        transport=worker.transport,
        models=worker.supported_models,
        upstream_api_key_changed=spec.upstream_api_key is not None,
    )
    return worker, created


@transaction.atomic
def worker_set_enabled(*, worker: Worker, enabled: bool, actor: object = "", via: str = "") -> Worker:
    Worker.objects.filter(pk=worker.pk).update(enabled=enabled, updated_at=timezone.now())
    worker.refresh_from_db()
    _audit(actor, "worker.enable" if enabled else "worker.disable", worker, via=via)
    return worker


@transaction.atomic
def worker_delete(*, worker: Worker, actor: object = "", via: str = "") -> None:
    name = str(worker)
    worker.delete()
    _audit(actor, "worker.delete", name, via=via)


def probe_record(*, result: ProbeResult, at: datetime | None = None) -> None:
    """Store one probe's outcome; the circuit is told separately (workers.circuit)."""
    at = at or timezone.now()
    load = result.load
    figures: dict[str, Any] = {}
    if load is not None:
        # A probe that read no figures clears the old ones: stale load must not steer routing.
        figures = {
            "runtime_queue": load.queue,
            "runtime_running": load.running,
            "runtime_max_running": load.max_running,
            "runtime_queue_time_ms": load.queue_time_ms,
            "runtime_kv_cache_usage": load.kv_cache_usage,
            "runtime_load_at": None if load.error else at,
            "runtime_load_error": load.error[:200],
        }
        if load.counters:
            figures["runtime_load_counters"] = load.counters
    Worker.objects.filter(pk=result.worker_pk).update(
        healthy=result.healthy,
        model_readiness=result.model_readiness,
        discovered_models=result.discovered_models,
        last_probe_at=at,
        last_probe_latency_ms=result.latency_ms,
        last_probe_error=result.error[:2000],
        **figures,
    )


def workers_probe(*, workers: Iterable[Worker]) -> list[tuple[Worker, ProbeResult]]:
    """Probe the workers concurrently, store each result and tell each circuit."""
    workers = list(workers)
    targets = [probe_target(w) for w in workers]
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        results = asyncio.run(probe_targets(targets))
    else:  # called from async code (an ASGI admin action): probe on a thread with a loop of its own
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            results = pool.submit(asyncio.run, probe_targets(targets)).result()
    now = timezone.now()
    for worker, result in zip(workers, results, strict=True):
        probe_record(result=result, at=now)
        if result.worker_fault:
            circuit.record_failure_sync(worker.worker_id, reason=f"probe: {result.error}")
        elif result.healthy:
            circuit.record_probe_success_sync(worker.worker_id)
    return list(zip(workers, results, strict=True))


def worker_circuit_reset(*, worker: Worker, actor: object = "", via: str = "") -> None:
    circuit.reset_sync(worker.worker_id)
    _audit(actor, "worker.circuit_reset", worker, via=via)
