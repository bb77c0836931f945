"""Prometheus metrics for GET /metrics.

Per-request series are counted in-process by `observe_request` (the gateway calls
it once per /v1 request, so it does a dict lookup and a few increments on cached
label children: a few microseconds). Worker health, circuit state and held
reservations are read from the database when Prometheus scrapes, never counted.

Several gateway processes: set PROMETHEUS_MULTIPROC_DIR to an empty directory
(wiped before the processes start) and prometheus_client keeps the counters in
shared mmap files; any process's /metrics then reports the sum. Unset, each
process reports its own counters (fine for the single-process default).

Labels have bounded cardinality: endpoint, model, status and worker only, never
a key, user, request id, worker URL or GPU UUID; models and endpoints a client
made up are folded into "other" past a small cap.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import REGISTRY, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, float("inf"))
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, float("inf"))
MAX_LABEL_VALUES = 200  # distinct models (and, separately, endpoints/workers) before "other"
OTHER = "other"

REQUESTS = Counter(
    "speedinfer_requests", "Finished /v1 requests.", ["endpoint", "model", "status", "worker"], registry=REGISTRY
)
LATENCY = Histogram(
    "speedinfer_request_duration_seconds",
    "Time from request to last byte of the response.",
    ["endpoint", "model", "worker"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
TTFT = Histogram(
    "speedinfer_time_to_first_token_seconds",
    "Time to the first streamed token.",
    ["model", "worker"],
    buckets=TTFT_BUCKETS,
    registry=REGISTRY,
)
TOKENS = Counter("speedinfer_tokens", "Tokens reported by the workers.", ["model", "kind"], registry=REGISTRY)


class _BoundedLabel:
    """Passes the first `limit` distinct values through, then answers OTHER."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seen: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self.seen:
            return value
        with self.lock:
            if len(self.seen) >= self.limit:
                return OTHER
            self.seen.add(value)
            return value


_models = _BoundedLabel(MAX_LABEL_VALUES)
_endpoints = _BoundedLabel(20)
_workers = _BoundedLabel(MAX_LABEL_VALUES)
# Statuses at which the model name is one the gateway resolved; before that (400,
# 401, 403, 404, 429) it is whatever the client sent, so it is not a label.
_MODEL_KNOWN = frozenset({200, 402, 502, 503, 504})

_Children = tuple[object, object, object | None, object, object]
_children: dict[tuple[str, str, int, str], _Children] = {}


def _children_for(endpoint: str, model: str, status: int, worker_id: str) -> _Children:
    model_label = _models(model) if (status in _MODEL_KNOWN and model) else "-"
    worker_label = _workers(worker_id) if worker_id else "-"
    endpoint_label = _endpoints(endpoint) if endpoint else "-"
    found = (
        REQUESTS.labels(endpoint_label, model_label, str(status), worker_label),
        LATENCY.labels(endpoint_label, model_label, worker_label),
        TTFT.labels(model_label, worker_label),
        TOKENS.labels(model_label, "prompt"),
        TOKENS.labels(model_label, "completion"),
    )
    _children[(endpoint, model, status, worker_id)] = found
    return found


def observe_request(
    *,
    endpoint: str,
    model: str,
    worker_id: str,
    status: int,
    latency_s: float,
    ttft_s: float | None = None,
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
) -> None:
    """Called by the gateway once per finished /v1 request. Must be cheap (hot path)."""
    children = _children.get((endpoint, model, status, worker_id))
    if children is None:
        children = _children_for(endpoint, model, status, worker_id)
    requests, latency, ttft, prompt, completion = children
    requests.inc()  # type: ignore[attr-defined]
    latency.observe(latency_s)  # type: ignore[attr-defined]
    if ttft_s is not None:
        ttft.observe(ttft_s)  # type: ignore[union-attr]
    if prompt_tokens:
        prompt.inc(prompt_tokens)  # type: ignore[attr-defined]
    if completion_tokens:
        completion.inc(completion_tokens)  # type: ignore[attr-defined]


class StateCollector(Collector):
    """Reads worker and reservation state from the database at scrape time."""

    def collect(self) -> Iterator[Metric]:
        from django.db.models import Count, Min, Sum

        from billing.models import MICRO, Reservation
        from workers.models import Worker

        up = GaugeMetricFamily("speedinfer_worker_healthy", "1 when the last probe succeeded.", labels=["worker"])
        enabled = GaugeMetricFamily("speedinfer_worker_enabled", "1 when staff enabled the worker.", labels=["worker"])
        circuit = GaugeMetricFamily(
            "speedinfer_worker_circuit_state", "1 for the circuit's current state.", labels=["worker", "state"]
        )
        ready = GaugeMetricFamily(
            "speedinfer_worker_model_ready", "1 when the worker reports the model ready.", labels=["worker", "model"]
        )
        probe = GaugeMetricFamily(
            "speedinfer_worker_probe_latency_seconds", "Duration of the last probe.", labels=["worker"]
        )
        probed = GaugeMetricFamily(
            "speedinfer_worker_last_probe_timestamp_seconds", "When the last probe ran.", labels=["worker"]
        )
        rows = Worker.objects.values_list(
            "worker_id",
            "healthy",
            "enabled",
            "circuit_state",
            "model_readiness",
            "last_probe_latency_ms",
            "last_probe_at",
        )
        for worker_id, healthy, is_enabled, state, readiness, latency_ms, probe_at in rows:
            up.add_metric([worker_id], 1.0 if healthy else 0.0)
            enabled.add_metric([worker_id], 1.0 if is_enabled else 0.0)
            for choice in Worker.Circuit.values:
                circuit.add_metric([worker_id, choice], 1.0 if state == choice else 0.0)
            for model_id, info in (readiness or {}).items():
                is_ready = info.get("ready") if isinstance(info, dict) else info
                ready.add_metric([worker_id, str(model_id)], 1.0 if is_ready else 0.0)
            if latency_ms is not None:
                probe.add_metric([worker_id], latency_ms / 1000)
            if probe_at is not None:
                probed.add_metric([worker_id], probe_at.timestamp())
        yield from (up, enabled, circuit, ready, probe, probed)

        held = Reservation.objects.filter(status=Reservation.Status.HELD).aggregate(
            n=Count("*"), amount=Sum("amount"), oldest=Min("created_at")
        )
        yield GaugeMetricFamily("speedinfer_reservations_held", "Reservations not yet settled.", value=held["n"] or 0)
        yield GaugeMetricFamily(
            "speedinfer_reserved_credits", "Credits held by those reservations.", value=(held["amount"] or 0) / MICRO
        )
        oldest = held["oldest"]
        yield GaugeMetricFamily(
            "speedinfer_reservation_oldest_age_seconds",
            "Age of the oldest held reservation (the sweeper releases it past the TTL).",
            value=max(0.0, time.time() - oldest.timestamp()) if oldest else 0.0,
        )


def _exposition() -> bytes:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
    else:
        registry = CollectorRegistry()
        registry.register(_DefaultRegistryProxy())
    registry.register(StateCollector())
    return generate_latest(registry)


class _DefaultRegistryProxy(Collector):
    """The process's own counters (and process/GC stats) inside a per-scrape registry."""

    def collect(self) -> Iterator[Metric]:
        return iter(REGISTRY.collect())


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse(_exposition(), content_type=CONTENT_TYPE_LATEST)
