"""Reads for workers: the registration document as the API shows it, and /health."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from workers.agent import agent_report_state
from workers.models import Worker


def worker_get(*, worker_id: str) -> Worker | None:
    return Worker.objects.filter(worker_id=worker_id).first()


def workers_enabled() -> QuerySet[Worker]:
    return Worker.objects.filter(enabled=True).order_by("worker_id")


def worker_document(*, worker: Worker) -> dict[str, Any]:
    """The registration JSON as it was given (plus read-only status); never the upstream key."""
    return {
        "worker_id": worker.worker_id,
        "worker_type": worker.worker_type,
        "runtime": worker.runtime,
        "runtime_endpoint": worker.runtime_endpoint,
        "supported_models": list(worker.supported_models),
        "runtime_config": dict(worker.runtime_config),
        "runtime_metadata": dict(worker.runtime_metadata),
        "gpu_metadata": dict(worker.gpu_metadata),
        "enabled": worker.enabled,
        "transport": worker.transport,
        "has_upstream_api_key": bool(worker.upstream_api_key),
        "status": {
            "healthy": worker.healthy,
            "circuit": worker.circuit_state,
            "consecutive_failures": worker.consecutive_failures,
            "models": model_readiness(worker=worker),
            "discovered_models": list(worker.discovered_models),
            "last_probe_at": worker.last_probe_at.isoformat() if worker.last_probe_at else None,
            "last_probe_latency_ms": worker.last_probe_latency_ms,
            "last_probe_error": worker.last_probe_error,
            "agent": worker_agent_status(worker=worker),
        },
    }


def worker_agent_status(*, worker: Worker) -> dict[str, Any] | None:
    """When the worker's agent (`manage.py workeragent`) last reported, and whether it stopped: None without one."""
    state = agent_report_state(runtime_metadata=worker.runtime_metadata, now=timezone.now())
    return state.as_dict() if state else None


def model_readiness(*, worker: Worker) -> dict[str, dict[str, bool]]:
    readiness = worker.model_readiness or {}
    return {model: {"ready": bool(readiness.get(model))} for model in worker.supported_models}


def health_report() -> dict[str, Any]:
    """GET /health (docs/interface.md, HTTP): one query; no endpoint, credential or metadata."""
    rows = list(
        workers_enabled().only(
            "worker_id",
            "runtime",
            "transport",
            "healthy",
            "circuit_state",
            "supported_models",
            "model_readiness",
            "last_probe_at",
        )
    )
    workers = [
        {
            "worker_id": w.worker_id,
            "runtime": w.runtime,
            "transport": w.transport,
            "healthy": w.healthy,
            "circuit": w.circuit_state,
            "models": model_readiness(worker=w),
            "last_probe_at": w.last_probe_at.isoformat() if w.last_probe_at else None,
        }
        for w in rows
    ]
    # A worker whose circuit is open takes no traffic, so it does not count as up.
    up = sum(1 for w in rows if w.healthy and w.circuit_state != Worker.Circuit.OPEN)
    if rows and up == len(rows):
        status = "ok"
    elif up:
        status = "degraded"
    else:
        status = "unavailable"
    return {"status": status, "workers": workers}
