"""OpenTelemetry traces of /v1 requests (docs/operations.md, Traces), exported over OTLP/HTTP.

Off unless `OTEL_EXPORTER_OTLP_ENDPOINT` is set when the gateway starts (`configure()`, called once per
process by proxy.asgi.with_gateway). Off, nothing from opentelemetry is imported and every request
carries `NO_TRACE`, whose methods do nothing: the hot path pays an attribute load and an empty call
per step. On, each /v1 request is one trace:

    POST /v1/chat/completions          (server; the GenAI attributes, set from the request's outcome)
      authenticate, rate_limit, queue_wait (once a queue exists), reserve
      worker_call                      (client, one per attempt; event first_byte; its traceparent goes to the worker)
      settle | release

An incoming `traceparent` (and `tracestate`) is honoured: the root span joins that trace. The worker
call's span context is handed to the transport as `CompletionParams.traceparent`, so a worker that
traces (vLLM, Triton) continues the same trace. No attribute holds a key (only its public prefix) or a
worker endpoint (only the worker id).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from core.outcome import RequestOutcome

# gen_ai.operation.name by /v1 route and by runtimes.request endpoint name
_OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "text_completion",
    "/v1/embeddings": "embeddings",
    "chat": "chat",
    "completions": "text_completion",
    "embeddings": "embeddings",
}
_NULL = nullcontext()  # reusable: entering it does nothing

# Set by configure() when tracing is on: the tracer and the few opentelemetry names the spans use, so
# that this module imports nothing from opentelemetry while tracing is off.
_tracer: Any = None
_provider: Any = None
_otel: dict[str, Any] = {}


class WorkerSpan:
    """One worker call (one attempt). Off: the shared `NO_WORKER_SPAN`, which does nothing."""

    __slots__ = ("_span", "traceparent")

    def __init__(self, span: Any = None, traceparent: str = "") -> None:
        self._span = span
        self.traceparent = traceparent  # the W3C header the worker is sent, "" when off

    def first_byte(self) -> None:
        if self._span is not None:
            self._span.add_event("first_byte")

    def end(self, error: str = "") -> None:
        """End the span (once; later calls do nothing), marked failed with the error code when given."""
        span, self._span = self._span, None
        if span is None:
            return
        if error:
            span.set_attribute("error.type", error)
            span.set_status(_otel["Status"](_otel["StatusCode"].ERROR, error))
        span.end()


NO_WORKER_SPAN = WorkerSpan()


class NoTrace:
    """The trace of a request while tracing is off: every method does nothing."""

    __slots__ = ()

    def step(self, name: str) -> AbstractContextManager[Any]:
        return _NULL

    def worker_call(self, *, worker_id: str, endpoint: str, model: str) -> WorkerSpan:
        return NO_WORKER_SPAN

    def end(self, outcome: RequestOutcome) -> None:
        return None


NO_TRACE = NoTrace()


class RequestTrace(NoTrace):
    """One /v1 request's trace: the root span, and its children as the request path goes through them."""

    __slots__ = ("_root", "_context")

    def __init__(self, root: Any, context: Any) -> None:
        self._root = root
        self._context = context  # the root span's context, the parent of every child

    def step(self, name: str) -> AbstractContextManager[Any]:
        return self._child(name)

    @contextmanager
    def _child(self, name: str) -> Iterator[Any]:
        span = _tracer.start_span(name, context=self._context)
        try:
            yield span
        except BaseException as exc:
            # A refusal (402, 429...) is the step's answer, not a crash: its code names what happened.
            span.set_attribute("error.type", getattr(exc, "code", None) or type(exc).__name__)
            span.set_status(_otel["Status"](_otel["StatusCode"].ERROR))
            raise
        finally:
            span.end()

    def worker_call(self, *, worker_id: str, endpoint: str, model: str) -> WorkerSpan:
        """The span of one call to a worker (endpoint: runtimes.request's CHAT, COMPLETIONS, EMBEDDINGS)."""
        span = _tracer.start_span(
            "worker_call",
            context=self._context,
            kind=_otel["SpanKind"].CLIENT,
            attributes={
                "gen_ai.operation.name": _OPERATIONS.get(endpoint, endpoint),
                "gen_ai.request.model": model,
                "speedinfer.worker.id": worker_id,
            },
        )
        ctx = span.get_span_context()
        return WorkerSpan(span, f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}")

    def end(self, outcome: RequestOutcome) -> None:
        root = self._root
        status = outcome.status
        attributes: dict[str, Any] = {"http.response.status_code": status}
        if outcome.model:
            attributes["gen_ai.request.model"] = outcome.model
        if outcome.worker_id:
            attributes["speedinfer.worker.id"] = outcome.worker_id
            attributes["gen_ai.response.model"] = outcome.model  # the worker's answer names the public model
        if outcome.key_prefix:
            attributes["speedinfer.key.prefix"] = outcome.key_prefix
        if outcome.account_id is not None:
            attributes["speedinfer.account.id"] = outcome.account_id
        if outcome.prompt_tokens or outcome.completion_tokens:
            attributes["gen_ai.usage.input_tokens"] = outcome.prompt_tokens
            attributes["gen_ai.usage.output_tokens"] = outcome.completion_tokens
        if outcome.streamed:
            attributes["speedinfer.stream"] = True
        if outcome.error_code:
            attributes["error.type"] = outcome.error_code
        root.set_attributes(attributes)
        if status >= 500:
            root.set_status(_otel["Status"](_otel["StatusCode"].ERROR, outcome.error_code or str(status)))
        root.end()


def request_trace(scope: Mapping[str, Any], route: str, request_id: str) -> NoTrace:
    """The trace of one /v1 request: NO_TRACE while tracing is off, else a started root span."""
    if _tracer is None:
        return NO_TRACE
    carrier = {}
    for name, value in scope["headers"]:
        if name in (b"traceparent", b"tracestate"):
            carrier[name.decode()] = value.decode("latin-1")
    # An absent or malformed traceparent extracts to an empty context: the request starts a new trace.
    parent = _otel["propagator"].extract(carrier) if carrier else _otel["Context"]()
    method = scope.get("method", "")
    attributes: dict[str, Any] = {
        "http.request.method": method,
        "http.route": route,
        "url.path": scope.get("path", ""),
        "speedinfer.request.id": request_id,
    }
    operation = _OPERATIONS.get(route)
    if operation:
        attributes["gen_ai.operation.name"] = operation
    root = _tracer.start_span(f"{method} {route}", context=parent, kind=_otel["SpanKind"].SERVER, attributes=attributes)
    return RequestTrace(root, _otel["set_span_in_context"](root))


def configure() -> bool:
    """Turn tracing on when OTEL_EXPORTER_OTLP_ENDPOINT is set (once per process; later calls do nothing).

    The exporter and the SDK read the standard OTEL_* variables themselves (the endpoint, with
    /v1/traces appended; OTEL_EXPORTER_OTLP_HEADERS; OTEL_TRACES_SAMPLER and its _ARG;
    OTEL_BSP_* for the batch processor; OTEL_SERVICE_NAME, default "speedinfer")."""
    global _tracer, _provider
    env = os.environ
    if _tracer is not None:
        return True
    if not (env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        return False
    from opentelemetry.context import Context
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    resource = Resource.create({} if env.get("OTEL_SERVICE_NAME") else {"service.name": "speedinfer"})
    provider = TracerProvider(resource=resource)
    # Batched, exported from the processor's own thread: a request never waits on the collector.
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _otel.update(
        Context=Context,
        SpanKind=SpanKind,
        Status=Status,
        StatusCode=StatusCode,
        set_span_in_context=set_span_in_context,
        propagator=TraceContextTextMapPropagator(),
    )
    _provider = provider
    _tracer = provider.get_tracer("speedinfer.gateway")
    return True


def enabled() -> bool:
    return _tracer is not None


def shutdown() -> None:
    """Export what is still batched and turn tracing off (tests; the SDK also flushes at exit)."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()
