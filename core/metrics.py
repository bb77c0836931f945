"""Prometheus metrics: the per-request series, and the exposition GET /metrics serves.

Per-request series are counted in-process by `observe_request` (the gateway calls
it once per /v1 request, so it does a dict lookup and a few increments on cached
label children: a few microseconds). Worker health, circuit state and held
reservations are read from the database when Prometheus scrapes, never counted
(billing.metrics and workers.metrics; speedinfer.metrics serves them together).

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
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import REGISTRY, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from core import state
from core.credits import MICRO
from core.outcome import RequestOutcome

# A `_created` timestamp per counter doubles the series and no dashboard reads it.
disable_created_metrics()

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
CREDITS_SPENT = Counter(
    "speedinfer_credits_spent", "Credits charged for settled /v1 requests.", ["model"], registry=REGISTRY
)
UNCHARGED_OVERRUN = Counter(
    "speedinfer_uncharged_overrun_credits",
    "Credits of usage a worker reported beyond what the account could pay: recorded, not charged.",
    ["worker"],
    registry=REGISTRY,
)

SETTLES_QUEUED = Gauge(
    "speedinfer_settles_queued",
    "Settles and releases waiting for the database, which was unreachable when their request ended (proxy.pending).",
    multiprocess_mode="livesum",
    registry=REGISTRY,
)


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


def observe_request(outcome: RequestOutcome) -> None:
    """Called by the gateway once per finished /v1 request. Must be cheap (hot path)."""
    endpoint, model, status, worker_id = outcome.endpoint, outcome.model, outcome.status, outcome.worker_id
    children = _children.get((endpoint, model, status, worker_id))
    if children is None:
        children = _children_for(endpoint, model, status, worker_id)
    requests, latency, ttft, prompt, completion = children
    requests.inc()  # type: ignore[attr-defined]
    latency.observe(outcome.duration())  # type: ignore[attr-defined]
    if outcome.ttft is not None:
        ttft.observe(outcome.ttft)  # type: ignore[union-attr]
    if outcome.prompt_tokens:
        prompt.inc(outcome.prompt_tokens)  # type: ignore[attr-defined]
    if outcome.completion_tokens:
        completion.inc(outcome.completion_tokens)  # type: ignore[attr-defined]


_spend_children: dict[str, object] = {}


def _forget_children() -> None:
    # Only the lookups of labelled children: the counters themselves are Prometheus's, and only grow.
    _children.clear()
    _spend_children.clear()


state.register("core.metrics.children", _forget_children)


def observe_spend(model: str, cost: int) -> None:
    """Called by the gateway with a settled request's charge (micro-credits). Hot path: a dict hit and an inc."""
    if cost <= 0:
        return
    child = _spend_children.get(model)
    if child is None:
        child = _spend_children[model] = CREDITS_SPENT.labels(_models(model) if model else "-")
    child.inc(cost / MICRO)  # type: ignore[attr-defined]


def observe_uncharged_overrun(*, worker_id: str, micro_credits: int) -> None:
    """A settle capped its charge at what the account could pay (the gateway calls it from the settle's result)."""
    UNCHARGED_OVERRUN.labels(_workers(worker_id) if worker_id else "-").inc(micro_credits / MICRO)


def observe_queued_close(change: int) -> None:
    """A settle or release was queued (+1) or left the queue (-1): written, or given up to the sweep."""
    SETTLES_QUEUED.inc(change)


def exposition(state: list[Collector]) -> bytes:
    """The text a scrape gets: this process's (or, multiprocess, every process's) counters, then
    the `state` collectors that read the database at scrape time (the wiring passes the apps' own)."""
    registry = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        MultiProcessCollector(registry)
    else:
        registry.register(_DefaultRegistryProxy())
    for collector in state:
        registry.register(collector)
    return generate_latest(registry)


class _DefaultRegistryProxy(Collector):
    """The process's own counters (and process/GC stats) inside a per-scrape registry."""

    def collect(self) -> Iterator[Metric]:
        return iter(REGISTRY.collect())
