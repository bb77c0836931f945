from __future__ import annotations

from django.db import models
from django.utils import timezone

from runtimes.target import WorkerTarget


class Worker(models.Model):
    """A connected GPU worker, registered from the spec's JSON.

    Registration fields mirror the JSON exactly. Health fields are written by the
    probes; circuit fields by workers.circuit. `upstream_api_key` is the worker's
    own credential (an OpenAI-compatible frontend behind a key): never shown back.
    """

    class Runtime(models.TextChoices):
        TRITON = "triton", "Triton"
        TENSORRT_LLM = "tensorrt-llm", "TensorRT-LLM"
        CUDA = "cuda", "CUDA"

    class Circuit(models.TextChoices):
        CLOSED = "closed"
        OPEN = "open"
        HALF_OPEN = "half_open"

    worker_id = models.CharField(max_length=200, unique=True)
    worker_type = models.CharField(max_length=50, default="nvidia-gpu")
    runtime = models.CharField(max_length=32, choices=Runtime.choices)
    transport = models.CharField(max_length=16, help_text="derived: 'triton' or 'openai'")
    runtime_endpoint = models.URLField(max_length=500)
    supported_models = models.JSONField(default=list)
    runtime_config = models.JSONField(default=dict, blank=True)
    runtime_metadata = models.JSONField(default=dict, blank=True)
    gpu_metadata = models.JSONField(default=dict, blank=True)
    upstream_api_key = models.CharField(max_length=500, blank=True, help_text="write-only; never shown back")
    enabled = models.BooleanField(default=True)

    healthy = models.BooleanField(default=False)
    model_readiness = models.JSONField(default=dict, blank=True)
    discovered_models = models.JSONField(default=list, blank=True)
    last_probe_at = models.DateTimeField(null=True, blank=True)
    last_probe_latency_ms = models.PositiveIntegerField(null=True, blank=True)
    last_probe_error = models.TextField(blank=True)

    circuit_state = models.CharField(max_length=16, choices=Circuit.choices, default=Circuit.CLOSED)
    consecutive_failures = models.PositiveIntegerField(default=0)
    circuit_opened_at = models.DateTimeField(null=True, blank=True)
    half_open_claimed_at = models.DateTimeField(null=True, blank=True)
    last_failure_reason = models.CharField(max_length=200, blank=True)

    # The load the runtime publishes at runtime_config.metrics_url, read by the probes (workers.load).
    # Null: not published (no metrics_url, or the runtime has no such figure).
    runtime_queue = models.PositiveIntegerField(null=True, blank=True, help_text="requests waiting in its queue")
    runtime_running = models.PositiveIntegerField(null=True, blank=True, help_text="requests it is running")
    runtime_max_running = models.PositiveIntegerField(null=True, blank=True, help_text="requests it can run at once")
    runtime_queue_time_ms = models.FloatField(null=True, blank=True, help_text="mean queue time since the last probe")
    runtime_kv_cache_usage = models.FloatField(null=True, blank=True, help_text="KV cache in use, 0 to 1")
    runtime_load_at = models.DateTimeField(null=True, blank=True)
    runtime_load_error = models.CharField(max_length=200, blank=True)
    # The runtime's cumulative counters at the last probe, for the next probe's queue-time delta.
    runtime_load_counters = models.JSONField(default=dict, blank=True)

    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["worker_id"]

    def __str__(self) -> str:
        return self.worker_id

    def target(self) -> WorkerTarget:
        """What a runtime client needs to call this worker (holds the endpoint: never logged or shown)."""
        return WorkerTarget(
            pk=self.pk,
            worker_id=self.worker_id,
            runtime=self.runtime,
            transport=self.transport,
            endpoint=self.runtime_endpoint.rstrip("/"),
            runtime_config=dict(self.runtime_config),
            upstream_api_key=self.upstream_api_key,
        )
