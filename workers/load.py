"""The load a runtime publishes about itself, read by the probes from `runtime_config.metrics_url`.

A Prometheus text endpoint is read once per probe and reduced to a few figures:

- queue: requests waiting in the runtime's own queue. TensorRT-LLM's backend
  `nv_trt_llm_request_metrics{request_type="waiting"}`, else Triton's
  `nv_inference_pending_request_count`, else vLLM's `vllm:num_requests_waiting`,
  SGLang's `sglang:num_queue_reqs` or trtllm-serve's `trtllm_num_requests_waiting`.
- running / max_running: `nv_trt_llm_request_metrics{request_type="active"|"max"}`,
  `vllm:num_requests_running`, `sglang:num_running_reqs`.
- kv_cache_usage (0 to 1): `nv_trt_llm_kv_cache_block_metrics` ("fraction", else used/max),
  `vllm:gpu_cache_usage_perc` / `vllm:kv_cache_usage_perc`.
- queue_time_ms: the mean time in the runtime's queue of the requests finished since the
  previous probe, from cumulative counters (Triton's `nv_inference_queue_duration_us` over
  `nv_inference_request_success`, vLLM's `vllm:request_queue_time_seconds` histogram); the
  counters are stored with the worker so the next probe can take the difference.

Triton series carry a `model` label: where some match the worker's `runtime_config.model_name`
only those count, else all of them are summed (a TensorRT-LLM ensemble reports under its parts).
The figures are advisory: a missing or unreadable endpoint leaves them unset and never makes a
worker unhealthy.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

MAX_METRICS_BYTES = 4 * 1024 * 1024  # a Triton with many models publishes a few hundred KiB

# series name -> [(labels, value)]
_Samples = dict[str, list[tuple[dict[str, str], float]]]


@dataclass(frozen=True, slots=True)
class RuntimeLoad:
    queue: int | None = None
    running: int | None = None
    max_running: int | None = None
    kv_cache_usage: float | None = None
    queue_time_ms: float | None = None
    counters: dict[str, float] = field(default_factory=dict)
    error: str = ""


def _samples(text: str) -> _Samples:
    found: _Samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # The parser names a counter's samples NAME_total even where the runtime wrote NAME
            # (Triton does): look every series up without the suffix.
            name = sample.name.removesuffix("_total")
            found[name].append((dict(sample.labels), float(sample.value)))
    return found


def _total(samples: _Samples, name: str, *, model: str = "", **labels: str) -> float | None:
    """The sum of a series' samples with these labels; None when the runtime does not publish it."""
    rows = [(lbl, v) for lbl, v in samples.get(name, ()) if all(lbl.get(k) == want for k, want in labels.items())]
    if not rows:
        return None
    if model and any(lbl.get("model") == model for lbl, _ in rows):
        rows = [(lbl, v) for lbl, v in rows if lbl.get("model") == model]
    return sum(v for _, v in rows)


def _first(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def _count(value: float | None) -> int | None:
    return None if value is None else max(0, round(value))


def parse_load(text: str, *, model_name: str = "", previous: dict[str, float] | None = None) -> RuntimeLoad:
    """Reduce a Prometheus text document to a RuntimeLoad; ValueError when it is not Prometheus text."""
    s = _samples(text)
    trt = "nv_trt_llm_request_metrics"
    queue = _first(
        _total(s, trt, request_type="waiting"),
        _total(s, "nv_inference_pending_request_count", model=model_name),
        _total(s, "vllm:num_requests_waiting"),
        _total(s, "sglang:num_queue_reqs"),
        _total(s, "trtllm_num_requests_waiting"),
    )
    running = _first(
        _total(s, trt, request_type="active"),
        _total(s, "vllm:num_requests_running"),
        _total(s, "sglang:num_running_reqs"),
    )
    kv_blocks = "nv_trt_llm_kv_cache_block_metrics"
    used, most = _total(s, kv_blocks, kv_cache_block_type="used"), _total(s, kv_blocks, kv_cache_block_type="max")
    kv = _first(
        _total(s, kv_blocks, kv_cache_block_type="fraction"),
        used / most if used is not None and most else None,
        _total(s, "vllm:kv_cache_usage_perc"),
        _total(s, "vllm:gpu_cache_usage_perc"),
    )
    counters: dict[str, float] = {}
    queue_us = _total(s, "nv_inference_queue_duration_us", model=model_name)
    done = _total(s, "nv_inference_request_success", model=model_name)
    if queue_us is not None and done is not None:
        counters = {"queue_s": queue_us / 1e6, "done": done}
    else:
        queue_s = _total(s, "vllm:request_queue_time_seconds_sum")
        queued = _total(s, "vllm:request_queue_time_seconds_count")
        if queue_s is not None and queued is not None:
            counters = {"queue_s": queue_s, "done": queued}
    return RuntimeLoad(
        queue=_count(queue),
        running=_count(running),
        max_running=_count(_total(s, trt, request_type="max")),
        kv_cache_usage=None if kv is None else min(1.0, max(0.0, kv)),
        queue_time_ms=_queue_time_ms(counters, previous or {}),
        counters=counters,
    )


def _queue_time_ms(now: dict[str, float], before: dict[str, Any]) -> float | None:
    try:
        finished = now["done"] - float(before["done"])
        waited = now["queue_s"] - float(before["queue_s"])
    except (KeyError, TypeError, ValueError):
        return None
    if finished <= 0 or waited < 0:  # nothing finished since, or the runtime restarted (counters reset)
        return None
    return waited / finished * 1000


async def fetch_load(
    *,
    url: str,
    model_name: str,
    previous: dict[str, float] | None,
    client: httpx.AsyncClient,
    http_timeout: httpx.Timeout,
) -> RuntimeLoad:
    """GET the metrics URL and parse it; problems come back as RuntimeLoad.error, never raised.

    No credential is sent: the URL may be on another host than the runtime's endpoint."""
    try:
        response = await client.get(url, timeout=http_timeout, headers={"Accept": "text/plain"})
    except httpx.TimeoutException:
        return RuntimeLoad(error="metrics: timed out")
    except httpx.HTTPError as exc:
        return RuntimeLoad(error=f"metrics: {type(exc).__name__}")
    if response.status_code != 200:
        return RuntimeLoad(error=f"metrics: HTTP {response.status_code}")
    if len(response.content) > MAX_METRICS_BYTES:
        return RuntimeLoad(error="metrics: document too large")
    try:
        return parse_load(response.text, model_name=model_name, previous=previous)
    except ValueError:
        return RuntimeLoad(error="metrics: not Prometheus text")
