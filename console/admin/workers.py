"""Staff admin for workers: register by pasting the spec's JSON, see health and circuit, act through services."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html_join

from workers import balancer, fleet, queue
from workers.agent import agent_report_state
from workers.models import Worker
from workers.registration import registration_validate
from workers.selectors import worker_document
from workers.services import (
    worker_circuit_reset,
    worker_delete,
    worker_register,
    worker_set_enabled,
    workers_probe,
)

# Shown in the empty Add-worker textarea: the spec's direct-Triton example, ready to edit.
EXAMPLE_REGISTRATION = json.dumps(
    {
        "worker_id": "triton-01",
        "worker_type": "nvidia-gpu",
        "runtime": "triton",
        "runtime_endpoint": "http://triton:8000",
        "supported_models": ["acme/model-1"],
        "runtime_config": {
            "model_name": "text_generation",
            "input_name": "text_input",
            "max_tokens_input_name": "max_tokens",
            "output_name": "text_output",
            "prompt_tokens_output_name": "prompt_tokens",
            "completion_tokens_output_name": "completion_tokens",
        },
    },
    indent=2,
)


def _registration_json(worker: Worker) -> str:
    doc = worker_document(worker=worker)
    for key in ("transport", "status", "has_upstream_api_key"):
        doc.pop(key)
    return json.dumps(doc, indent=2)


class WorkerRegistrationForm(forms.ModelForm):
    """The registration JSON in a textarea, validated by workers.registration like the command and the API."""

    registration = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 18, "cols": 100, "style": "font-family: monospace"}),
        help_text="The worker's registration JSON, as in the spec (worker_id, runtime, runtime_endpoint, ...).",
    )
    upstream_api_key = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="The worker's own credential, if its frontend needs one. Write-only: leave empty to keep the "
        "stored one.",
    )
    clear_upstream_api_key = forms.BooleanField(required=False, help_text="Remove the stored credential.")

    class Meta:
        model = Worker
        fields: list[str] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.fields["registration"].initial = _registration_json(self.instance)
        else:
            self.fields["registration"].widget.attrs["placeholder"] = EXAMPLE_REGISTRATION
            self.fields["registration"].help_text += (
                " Example (a direct Triton worker; an OpenAI-compatible one has runtime_config "
                '{"transport": "openai"} and an endpoint ending in /v1): see the placeholder.'
            )
        self.registered: tuple[Worker, bool] | None = None

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        text = cleaned.get("registration")
        if not text:
            return cleaned
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValidationError({"registration": f"not valid JSON: {exc.msg} at line {exc.lineno}"}) from None
        if not isinstance(data, dict):
            raise ValidationError({"registration": "must be a JSON object"})
        if self.instance.pk and data.get("worker_id") != self.instance.worker_id:
            raise ValidationError({"registration": "worker_id cannot change; register a new worker instead"})
        if cleaned.get("clear_upstream_api_key"):
            data["upstream_api_key"] = ""
        elif cleaned.get("upstream_api_key"):
            data["upstream_api_key"] = cleaned["upstream_api_key"]
        self.cleaned_data["document"] = data
        return cleaned

    actor: object = ""  # the staff user, set by WorkerAdmin.get_form

    def save(self, commit: bool = True) -> Worker:
        # Registration is the service's job whatever `commit` says: the admin's later obj.save() is a no-op
        # rewrite of the same row.
        worker, created = worker_register(data=self.cleaned_data["document"], actor=self.actor, via="admin")
        self.registered = (worker, created)
        self.instance = worker
        self.save_m2m = lambda: None  # type: ignore[method-assign]
        return worker

    def _post_clean(self) -> None:
        # Validate the document here, where errors can still be shown on the form, with the one shared
        # validation (the model's own field validation would refuse the spec's http://triton:8000).
        document = self.cleaned_data.get("document")
        if document is None:
            return
        try:
            registration_validate(document)
        except ValidationError as exc:
            messages_ = [
                f"{field}: {m}" for field, errors in exc.error_dict.items() for e in errors for m in e.messages
            ]
            self.add_error("registration", messages_)


# What a worker's page shows below its registration, all read-only (the registration JSON is the one input).
SHOWN_FIELDSETS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("Registered", {"fields": ("runtime", "transport", "runtime_endpoint", "supported_models")}),
    ("Worker-supplied metadata", {"fields": ("gpu_metadata_table", "runtime_metadata_table")}),
    ("Credential", {"fields": ("has_upstream_api_key",)}),
    (
        "Health",
        {
            "fields": (
                "healthy",
                "models_ready",
                "agent_report",
                "discovered_models",
                "last_probe_at",
                "last_probe_latency_ms",
                "last_probe_error",
            )
        },
    ),
    ("Circuit", {"fields": ("circuit_state", "consecutive_failures", "circuit_opened_at", "last_failure_reason")}),
    (
        "Load",
        {
            "fields": (
                "load",
                "capacity",
                "runtime_queue",
                "runtime_running",
                "runtime_max_running",
                "runtime_queue_time_ms",
                "runtime_kv_cache_usage",
                "runtime_load_at",
                "runtime_load_error",
            ),
            "description": "In flight and latency as this server process sees them now; the runtime's "
            "own figures from the last probe (runtime_config.metrics_url).",
        },
    ),
)
SHOWN_FIELDS = tuple(name for _, options in SHOWN_FIELDSETS for name in options["fields"])


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    form = WorkerRegistrationForm
    # The probe error right after the state it explains, so it is on screen at 1280 px.
    list_display = (
        "worker_id",
        "enabled",
        "healthy",
        "circuit_state",
        "probe_error",
        "models_ready",
        "agent_report",
        "load",
        "last_probe_at",
        "last_probe_latency_ms",
    )
    list_filter = ("runtime", "transport", "enabled", "healthy", "circuit_state")
    search_fields = ("worker_id",)
    actions = ("probe_now", "enable", "disable", "reset_circuit")

    def get_form(self, request: HttpRequest, obj: Worker | None = None, change: bool = False, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change=change, **kwargs)
        # A subclass per request, so the registration service can audit who made the change.
        return type(form.__name__, (form,), {"actor": request.user})

    def get_fieldsets(self, request: HttpRequest, obj: Worker | None = None) -> Any:
        register = (None, {"fields": ("registration", "upstream_api_key", "clear_upstream_api_key")})
        if obj is None:
            return [register]
        return [register, *SHOWN_FIELDSETS]

    def get_readonly_fields(self, request: HttpRequest, obj: Worker | None = None) -> Any:
        return SHOWN_FIELDS if obj else ()

    change_form_template = "admin/workers/worker/change_form.html"

    @admin.display(description="probe error")
    def probe_error(self, obj: Worker) -> str:
        error = obj.last_probe_error or ""
        return error if len(error) <= 80 else error[:79] + "…"

    def get_urls(self) -> list[URLPattern]:
        probe = path(
            "<path:object_id>/probe/", self.admin_site.admin_view(self.probe_view), name="workers_worker_probe"
        )
        return [probe, *super().get_urls()]

    def probe_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The worker page's "Probe now" button: probe this one worker and come back to its page."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_change_permission(request):
            raise PermissionDenied
        worker = get_object_or_404(Worker, pk=object_id)
        self.probe_now(request, Worker.objects.filter(pk=worker.pk))
        return HttpResponseRedirect(reverse("admin:workers_worker_change", args=[worker.pk]))

    def response_add(self, request: HttpRequest, obj: Worker, post_url_continue: str | None = None) -> HttpResponse:
        # Registering an existing worker_id updates that worker: say so, not "added".
        form_created = getattr(request, "_worker_created", True)
        if form_created:
            return super().response_add(request, obj, post_url_continue)
        self.message_user(request, f"The worker “{obj.worker_id}” was updated (it was already registered).")
        return HttpResponseRedirect(reverse("admin:workers_worker_change", args=[obj.pk]))

    def save_form(self, request: HttpRequest, form: Any, change: bool) -> Any:
        worker = super().save_form(request, form, change)
        if getattr(form, "registered", None):
            request._worker_created = form.registered[1]  # type: ignore[attr-defined]
        return worker

    def delete_model(self, request: HttpRequest, obj: Worker) -> None:
        worker_delete(worker=obj, actor=request.user, via="admin")  # audited, as disabling is

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Worker]) -> None:
        for worker in queryset:
            worker_delete(worker=worker, actor=request.user, via="admin")

    @admin.display(description="models ready")
    def models_ready(self, obj: Worker) -> str:
        readiness = obj.model_readiness or {}
        return ", ".join(f"{m} {'ready' if readiness.get(m) else 'not ready'}" for m in obj.supported_models)

    @admin.display(description="agent")
    def agent_report(self, obj: Worker) -> str:
        # Workers registered by hand have no agent; one whose agent went quiet says "stale".
        state = agent_report_state(runtime_metadata=obj.runtime_metadata, now=timezone.now())
        return state.describe() if state else "-"

    @admin.display(description="load")
    def load(self, obj: Worker) -> str:
        parts = [f"{fleet.view().get(obj.worker_id, 0)} in flight"]
        if obj.runtime_queue is not None:
            parts.append(f"{obj.runtime_queue} queued")
        seen = balancer.view().get(obj.worker_id)
        if seen is not None:
            parts.append(f"latency ~{float(seen['latency_ms']):.0f} ms")
            if seen["failed_recently"]:
                parts.append("failed recently")
        return ", ".join(parts)

    @admin.display(description="capacity and queue")
    def capacity(self, obj: Worker) -> str:
        """The capacity the scheduler gates on (workers.routing._capacity) and, as this process sees them,
        the slots held on the worker and the requests waiting for its models (docs/scheduler.md)."""
        declared = (obj.runtime_config or {}).get("max_concurrency")
        if isinstance(declared, int) and not isinstance(declared, bool):
            parts = [f"capacity {declared} (runtime_config.max_concurrency)"]
        elif obj.runtime_max_running:
            parts = [f"capacity {obj.runtime_max_running} (the runtime's figure)"]
        else:
            parts = ["capacity not declared (not gated)"]
        parts.append(f"{queue.held().get(obj.worker_id, 0)} slots held here")
        lengths = queue.queue_lengths()
        models = set(obj.supported_models or [])
        waiting = {p: sum(n for (m, pr), n in lengths.items() if m in models and pr == p) for p in ("high", "normal")}
        parts.append(f"waiting for its models: {waiting['high']} high, {waiting['normal']} normal")
        return ", ".join(parts)

    @admin.display(description="upstream credential", boolean=True)
    def has_upstream_api_key(self, obj: Worker) -> bool:
        return bool(obj.upstream_api_key)

    def _table(self, data: dict[str, Any]) -> str:
        if not data:
            return "-"
        rows = ((k, json.dumps(v) if not isinstance(v, str) else v) for k, v in sorted(data.items()))
        return format_html_join("", "<div><b>{}</b>: {}</div>", rows)

    @admin.display(description="GPU metadata")
    def gpu_metadata_table(self, obj: Worker) -> str:
        return self._table(obj.gpu_metadata)

    @admin.display(description="runtime metadata")
    def runtime_metadata_table(self, obj: Worker) -> str:
        return self._table(obj.runtime_metadata)

    @admin.action(description="Probe now")
    def probe_now(self, request: HttpRequest, queryset: QuerySet[Worker]) -> None:
        results = workers_probe(workers=queryset)
        for worker, result in results:
            level = messages.SUCCESS if result.healthy else messages.WARNING
            state = "healthy" if result.healthy else f"unhealthy ({result.error})"
            # Django's admin capitalises a message's first letter: never start with an id ("Down-03").
            self.message_user(request, f"Worker {worker.worker_id}: {state}, {result.latency_ms} ms", level)

    @admin.action(description="Enable")
    def enable(self, request: HttpRequest, queryset: QuerySet[Worker]) -> None:
        for worker in queryset:
            worker_set_enabled(worker=worker, enabled=True, actor=request.user, via="admin")
        self.message_user(request, f"Enabled {queryset.count()} worker(s).")

    @admin.action(description="Disable")
    def disable(self, request: HttpRequest, queryset: QuerySet[Worker]) -> None:
        for worker in queryset:
            worker_set_enabled(worker=worker, enabled=False, actor=request.user, via="admin")
        self.message_user(request, f"Disabled {queryset.count()} worker(s).")

    @admin.action(description="Reset circuit")
    def reset_circuit(self, request: HttpRequest, queryset: QuerySet[Worker]) -> None:
        for worker in queryset:
            worker_circuit_reset(worker=worker, actor=request.user, via="admin")
        self.message_user(request, f"Reset the circuit of {queryset.count()} worker(s).")
