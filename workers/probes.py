"""Health and discovery probes: one per worker, run concurrently by workers.tasks.probe_all_workers."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace

import httpx
from django.conf import settings

from runtimes.errors import WorkerError
from runtimes.openai import openai_models
from runtimes.target import WorkerTarget
from runtimes.triton import triton_model_ready, triton_repository_index, triton_server_ready
from workers.load import RuntimeLoad, fetch_load
from workers.models import Worker

log = logging.getLogger("speedinfer.probes")


@dataclass(frozen=True)
class ProbeResult:
    """What one probe learned about one worker."""

    worker_pk: int
    healthy: bool
    model_readiness: dict[str, bool]
    discovered_models: list[str]
    latency_ms: int
    error: str = ""
    # A connection error, timeout or 5xx: counts against the circuit.
    worker_fault: bool = False
    # What the runtime published at runtime_config.metrics_url; None when it has none.
    load: RuntimeLoad | None = None


@dataclass(frozen=True)
class ProbeTarget:
    view: WorkerTarget
    supported_models: list[str]
    load_counters: dict[str, float] = field(default_factory=dict)


def probe_target(worker: Worker) -> ProbeTarget:
    return ProbeTarget(
        view=worker.target(),
        supported_models=list(worker.supported_models),
        load_counters=dict(worker.runtime_load_counters or {}),
    )


def _timeout() -> httpx.Timeout:
    return httpx.Timeout(settings.SPEEDINFER_PROBE_TIMEOUT)


def _ms(started: float) -> int:
    return int((time.perf_counter() - started) * 1000)


def _failed(target: ProbeTarget, started: float, exc: WorkerError) -> ProbeResult:
    # The endpoint stays out of the stored error: staff see it in the admin anyway, and this text
    # may end up in logs. exc.detail names the exception only.
    return ProbeResult(
        worker_pk=target.view.pk,
        healthy=False,
        model_readiness={},
        discovered_models=[],
        latency_ms=_ms(started),
        error=f"{exc.code}: {exc.message}",
        worker_fault=exc.counts_against_circuit,
    )


async def probe_triton_worker(*, target: ProbeTarget, client: httpx.AsyncClient) -> ProbeResult:
    """Server readiness, the configured model's readiness (for every declared public model), the index."""
    started = time.perf_counter()
    worker = target.view
    timeout = _timeout()
    try:
        ready, why = await triton_server_ready(worker=worker, http_timeout=timeout, client=client)
        # The text-generation model and the embedding model, where the worker declares each.
        embeddings = worker.runtime_config.get("embeddings")
        names = [str(worker.runtime_config.get("model_name") or "")]
        if isinstance(embeddings, dict):
            names = [n for n in names if n] + [str(embeddings.get("model_name", ""))]
        model_ok, model_why, model_name = True, "", names[0]
        for name in names:
            ok, name_why = await triton_model_ready(worker=worker, model_name=name, http_timeout=timeout, client=client)
            if not ok and model_ok:
                model_ok, model_why, model_name = False, name_why, name
        try:
            discovered = await triton_repository_index(worker=worker, http_timeout=timeout, client=client)
        except WorkerError as exc:  # diagnostics only: never makes a worker unhealthy
            log.info("worker %s: repository index failed: %s", worker.worker_id, exc.message)
            discovered = []
    except WorkerError as exc:
        return _failed(target, started, exc)
    errors = [e for e in (why and f"server not ready: {why}", model_why and f"model {model_name}: {model_why}") if e]
    return ProbeResult(
        worker_pk=worker.pk,
        healthy=ready,
        model_readiness={m: ready and model_ok for m in target.supported_models},
        discovered_models=discovered,
        latency_ms=_ms(started),
        error="; ".join(errors),
    )


async def probe_openai_worker(*, target: ProbeTarget, client: httpx.AsyncClient) -> ProbeResult:
    """GET {endpoint}/models: healthy when it answers; a declared model (through model_map) listed there is ready."""
    started = time.perf_counter()
    worker = target.view
    try:
        served, why = await openai_models(worker=worker, http_timeout=_timeout(), client=client)
    except WorkerError as exc:
        return _failed(target, started, exc)
    if served is None:
        return ProbeResult(
            worker_pk=worker.pk,
            healthy=False,
            model_readiness={},
            discovered_models=[],
            latency_ms=_ms(started),
            error=why,
        )
    readiness = {m: worker.upstream_model(m) in served for m in target.supported_models}
    missing = [m for m, ok in readiness.items() if not ok]
    return ProbeResult(
        worker_pk=worker.pk,
        healthy=True,
        model_readiness=readiness,
        discovered_models=sorted(served),
        latency_ms=_ms(started),
        error=f"not served by the worker: {', '.join(missing)}" if missing else "",
    )


async def probe_load(*, target: ProbeTarget, result: ProbeResult, client: httpx.AsyncClient) -> ProbeResult:
    """Add the load the runtime publishes (runtime_config.metrics_url), for a healthy worker that has one."""
    url = target.view.runtime_config.get("metrics_url")
    if not url or not result.healthy:
        return result
    load = await fetch_load(
        url=str(url),
        model_name=str(target.view.runtime_config.get("model_name", "")),
        previous=target.load_counters,
        client=client,
        http_timeout=_timeout(),
    )
    return replace(result, load=load)


async def _probe_one(target: ProbeTarget, client: httpx.AsyncClient) -> ProbeResult:
    if target.view.transport == "triton":
        result = await probe_triton_worker(target=target, client=client)
    else:
        result = await probe_openai_worker(target=target, client=client)
    return await probe_load(target=target, result=result, client=client)


async def probe_targets(targets: list[ProbeTarget]) -> list[ProbeResult]:
    """Probe every target concurrently with a client of this call's own (probes run under asyncio.run)."""
    async with httpx.AsyncClient(follow_redirects=False) as client:
        return list(await asyncio.gather(*(_probe_one(t, client) for t in targets)))
