"""Prometheus metrics. (Interface; the admin/dashboard/metrics issue fills it in.)

Labels have bounded cardinality: model, status, worker_id, endpoint; never a key,
user or request id.
"""

from __future__ import annotations


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
