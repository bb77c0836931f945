"""Worker health, circuit, readiness and load gauges, read from the database when Prometheus scrapes
(in flight and the latency estimate from this process's memory: workers.fleet, workers.balancer), and the
scheduler's figures, also this process's: the gateway-side queue per model and priority, its 503
`overloaded` refusals, capacity slots and prefix-hit estimates per worker (workers.queue, workers.prefix)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from workers import balancer, fleet, prefix, queue, routing
from workers.models import Worker


def _declared(models: object) -> list[str]:
    """The public model ids a worker registered with (supported_models)."""
    return [str(m) for m in models if m] if isinstance(models, list) else []


class WorkerCollector(Collector):
    def collect(self) -> Iterator[Metric]:
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
        flying = GaugeMetricFamily(
            "speedinfer_worker_in_flight",
            "Requests in flight to the worker from every gateway process, as this process last saw them.",
            labels=["worker"],
        )
        queue = GaugeMetricFamily(
            "speedinfer_worker_runtime_queue",
            "Requests waiting in the runtime's own queue at the last probe (runtime_config.metrics_url).",
            labels=["worker"],
        )
        ewma = GaugeMetricFamily(
            "speedinfer_worker_latency_ewma_seconds",
            "This process's peak-EWMA of the worker's latency (the routing score's L).",
            labels=["worker"],
        )
        in_flight, observed = fleet.view(), balancer.view()
        rows = Worker.objects.values_list(
            "worker_id",
            "healthy",
            "enabled",
            "circuit_state",
            "model_readiness",
            "supported_models",
            "last_probe_latency_ms",
            "last_probe_at",
            "runtime_queue",
        )
        for worker_id, healthy, is_enabled, state, readiness, declared, latency_ms, probe_at, runtime_queue in rows:
            up.add_metric([worker_id], 1.0 if healthy else 0.0)
            enabled.add_metric([worker_id], 1.0 if is_enabled else 0.0)
            for choice in Worker.Circuit.values:
                circuit.add_metric([worker_id, choice], 1.0 if state == choice else 0.0)
            # Every declared model has a series, 0 while the worker is down or has not said
            # it is ready: a missing series would hide the outage from a `== 0` alert.
            reported = readiness if isinstance(readiness, dict) else {}
            for model_id in dict.fromkeys([*_declared(declared), *map(str, reported)]):
                info = reported.get(model_id)
                is_ready = healthy and (info.get("ready") if isinstance(info, dict) else info)
                ready.add_metric([worker_id, model_id], 1.0 if is_ready else 0.0)
            if latency_ms is not None:
                probe.add_metric([worker_id], latency_ms / 1000)
            if probe_at is not None:
                probed.add_metric([worker_id], probe_at.timestamp())
            flying.add_metric([worker_id], float(in_flight.get(worker_id, 0)))
            if runtime_queue is not None:
                queue.add_metric([worker_id], float(runtime_queue))
            if worker_id in observed:
                ewma.add_metric([worker_id], float(observed[worker_id]["latency_ms"]) / 1000)
        yield from (up, enabled, circuit, ready, probe, probed, flying, queue, ewma)
        yield from _scheduler_metrics([row[0] for row in rows])


def _scheduler_metrics(worker_ids: list[str]) -> Iterator[Metric]:
    waiting = GaugeMetricFamily(
        "speedinfer_queue_waiting",
        "Requests waiting in this gateway process for a capacity slot (the model's workers are all full).",
        labels=["model", "priority"],
    )
    for (model_id, priority), count in queue.queue_lengths().items():
        waiting.add_metric([model_id, priority], float(count))
    waited = CounterMetricFamily(
        "speedinfer_queue_waited", "Requests that waited for a capacity slot.", labels=["model", "priority"]
    )
    wait_s = CounterMetricFamily(
        "speedinfer_queue_wait_seconds",
        "Seconds requests waited for a capacity slot, in all.",
        labels=["model", "priority"],
    )
    for (model_id, priority), (count, seconds) in queue.wait_totals().items():
        waited.add_metric([model_id, priority], float(count))
        wait_s.add_metric([model_id, priority], seconds)
    refused = CounterMetricFamily(
        "speedinfer_overloaded",
        "503 overloaded answers: low priority refused while saturated, or the queue timeout ran out.",
        labels=["model", "priority"],
    )
    for (model_id, priority), count in queue.refusals().items():
        refused.add_metric([model_id, priority], float(count))
    capacity = GaugeMetricFamily(
        "speedinfer_worker_capacity",
        "Requests the worker runs at once (runtime_config.max_concurrency or the runtime's figure).",
        labels=["worker"],
    )
    held = GaugeMetricFamily("speedinfer_worker_slots_held", "Capacity slots this process holds.", labels=["worker"])
    slots = queue.held()
    for worker_id in worker_ids:
        cap = routing.capacity(worker_id)
        if cap is not None:
            capacity.add_metric([worker_id], float(cap))
            held.add_metric([worker_id], float(slots.get(worker_id, 0)))
    hit = GaugeMetricFamily(
        "speedinfer_worker_prefix_hit_ratio",
        "Estimated share of the prompt blocks sent to the worker that it had been sent recently (prefix index).",
        labels=["worker"],
    )
    for worker_id, (matched, asked) in prefix.hit_estimates().items():
        if asked:
            hit.add_metric([worker_id], matched / asked)
    yield from (waiting, waited, wait_s, refused, capacity, held, hit)
