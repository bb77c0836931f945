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
        TRITON = "triton"
        TENSORRT_LLM = "tensorrt-llm"
        CUDA = "cuda"

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
