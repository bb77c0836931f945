"""OpenTelemetry traces of /v1 requests, exported to a real local OTLP/HTTP receiver (docs/operations.md, Traces)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy import tracing

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_gateway"), pytest.mark.sqlite]

ROOT = Path(__file__).resolve().parent.parent
CHILDREN = {"authenticate", "rate_limit", "reserve", "worker_call", "settle"}


class OTLPReceiver:
    """A collector's OTLP/HTTP endpoint: POST /v1/traces with an ExportTraceServiceRequest (protobuf)."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        self.spans: list[Any] = []
        self.resources: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                with receiver.lock:
                    receiver.paths.append(self.path)
                    for resource_spans in request.resource_spans:
                        receiver.resources.append(attributes(resource_spans.resource.attributes))
                        for scope_spans in resource_spans.scope_spans:
                            receiver.spans.extend(scope_spans.spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def trace_of(self, request_id: str, *, timeout: float = 10) -> list[Any]:
        """Every span of the trace whose root carries `request_id`, once its root has arrived."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                roots = [s for s in self.spans if attributes(s.attributes).get("speedinfer.request.id") == request_id]
                if roots:
                    return [s for s in self.spans if s.trace_id == roots[0].trace_id]
            time.sleep(0.05)
        raise AssertionError(f"no trace for request {request_id} reached the receiver")

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def attributes(items: Any) -> dict[str, Any]:
    """OTLP KeyValues as a dict of plain values."""
    found: dict[str, Any] = {}
    for item in items:
        kind = item.value.WhichOneof("value")
        found[item.key] = getattr(item.value, kind) if kind else None
    return found


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OTLPReceiver]:
    """Tracing on in this process's gateway, exporting to a fresh receiver."""
    server = OTLPReceiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", server.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # milliseconds: the test needn't wait the default 5 s
    assert tracing.configure()
    yield server
    tracing.shutdown()
    server.stop()


def by_name(spans: list[Any]) -> dict[str, Any]:
    return {s.name: s for s in spans}


def post(world: dict[str, Any], path: str, payload: dict[str, Any], **headers: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {world['secret']}", **headers}
    return httpx.post(world["url"] + path, json=payload, headers=headers, timeout=10)


def assert_no_secret_or_endpoint(spans: list[Any], world: dict[str, Any], receiver: OTLPReceiver) -> None:
    endpoint = world["simulator"].base_url
    secret = world["secret"]
    values = [str(v) for s in spans for v in attributes(s.attributes).values()]
    values += [str(v) for s in spans for e in s.events for v in attributes(e.attributes).values()]
    values += [str(v) for r in receiver.resources for v in r.values()]
    hostport = endpoint.split("//", 1)[1].split("/", 1)[0]
    assert values
    assert not [v for v in values if secret in v or endpoint in v or hostport in v]


def test_a_chat_completion_is_one_trace_with_the_genai_attributes(world, receiver):
    response = post(
        world,
        "/v1/chat/completions",
        {"model": "acme/model-1", "messages": [{"role": "user", "content": "hello traced world"}]},
        **{"x-request-id": "trace-chat-1"},
    )
    assert response.status_code == 200
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0

    spans = receiver.trace_of("trace-chat-1")
    named = by_name(spans)
    root = named["POST /v1/chat/completions"]
    assert root.kind == root.SPAN_KIND_SERVER and not root.parent_span_id
    assert CHILDREN <= set(named)
    for name in CHILDREN:
        assert named[name].parent_span_id == root.span_id, name
        assert root.start_time_unix_nano <= named[name].start_time_unix_nano <= named[name].end_time_unix_nano
    # The steps run in the documented order.
    order = sorted(CHILDREN, key=lambda n: named[n].start_time_unix_nano)
    assert order == ["authenticate", "rate_limit", "reserve", "worker_call", "settle"]

    root_attrs = attributes(root.attributes)
    assert root_attrs["gen_ai.operation.name"] == "chat"
    assert root_attrs["gen_ai.request.model"] == "acme/model-1"
    assert root_attrs["gen_ai.response.model"] == "acme/model-1"
    assert root_attrs["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert root_attrs["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert root_attrs["http.response.status_code"] == 200
    assert root_attrs["speedinfer.worker.id"] == "sim-1"
    assert root_attrs["speedinfer.key.prefix"] == world["key"].prefix

    call = named["worker_call"]
    assert call.kind == call.SPAN_KIND_CLIENT
    assert attributes(call.attributes)["speedinfer.worker.id"] == "sim-1"
    assert [e.name for e in call.events] == ["first_byte"]
    assert receiver.paths and set(receiver.paths) == {"/v1/traces"}
    assert {"service.name": "speedinfer"}.items() <= receiver.resources[0].items()
    assert_no_secret_or_endpoint(spans, world, receiver)


def test_an_incoming_traceparent_is_kept_and_passed_to_the_worker(world, receiver):
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    simulator = world["simulator"].simulator
    messages = [{"role": "user", "content": f"stream me {trace_id}"}]
    with httpx.stream(
        "POST",
        world["url"] + "/v1/chat/completions",
        json={"model": "acme/model-1", "stream": True, "messages": messages},
        headers={
            "Authorization": f"Bearer {world['secret']}",
            "traceparent": f"00-{trace_id}-{parent_id}-01",
            "x-request-id": "trace-stream-1",
        },
        timeout=10,
    ) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"

    spans = receiver.trace_of("trace-stream-1")
    named = by_name(spans)
    root = named["POST /v1/chat/completions"]
    assert root.trace_id.hex() == trace_id and root.parent_span_id.hex() == parent_id
    assert CHILDREN <= set(named)
    call = named["worker_call"]
    assert [e.name for e in call.events] == ["first_byte"]
    assert call.start_time_unix_nano < call.events[0].time_unix_nano <= call.end_time_unix_nano
    assert call.end_time_unix_nano <= named["settle"].start_time_unix_nano  # the worker's last event, then settle

    # The worker was sent the worker-call span as its parent, in the same trace.
    sent = [r["traceparent"] for r in list(simulator.stats.requests) if r["body"].get("messages") == messages]
    assert sent == [f"00-{trace_id}-{call.span_id.hex()}-01"]
    attrs = attributes(root.attributes)
    assert attrs["speedinfer.stream"] is True
    assert attrs["gen_ai.usage.output_tokens"] > 0
    assert_no_secret_or_endpoint(spans, world, receiver)


def test_a_refused_request_is_traced_with_its_error(world, receiver):
    world = {**world, "secret": world["secret"] + "x"}
    response = post(
        world,
        "/v1/chat/completions",
        {"model": "acme/model-1", "messages": [{"role": "user", "content": "hi"}]},
        **{"x-request-id": "trace-refused-1"},
    )
    assert response.status_code == 401
    named = by_name(receiver.trace_of("trace-refused-1"))
    root = attributes(named["POST /v1/chat/completions"].attributes)
    assert root["http.response.status_code"] == 401 and root["error.type"] == "invalid_api_key"
    authenticate = named["authenticate"]
    assert authenticate.status.code == authenticate.status.STATUS_CODE_ERROR
    assert "worker_call" not in named and "reserve" not in named
    assert_no_secret_or_endpoint(list(named.values()), world, receiver)


class TritonLike:
    """A Triton HTTP v2 infer endpoint that answers one fixed result and records each request's traceparent."""

    def __init__(self) -> None:
        self.traceparents: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.traceparents.append(self.headers.get("traceparent", ""))
                outputs = [
                    {"name": "text_output", "datatype": "BYTES", "shape": [1], "data": ["hello"]},
                    {"name": "prompt_tokens", "datatype": "INT32", "shape": [1], "data": [3]},
                    {"name": "completion_tokens", "datatype": "INT32", "shape": [1], "data": [1]},
                ]
                answer = json.dumps({"model_name": "m", "outputs": outputs}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_the_triton_transport_sends_the_traceparent():
    import asyncio

    from runtimes.client import client_for
    from runtimes.http import close_client
    from runtimes.request import CHAT, CompletionParams
    from runtimes.target import WorkerTarget

    triton = TritonLike()
    names = {
        "model_name": "m",
        "input_name": "text_input",
        "max_tokens_input_name": "max_tokens",
        "output_name": "text_output",
        "prompt_tokens_output_name": "prompt_tokens",
        "completion_tokens_output_name": "completion_tokens",
    }
    worker = WorkerTarget(
        pk=1, worker_id="t", runtime="triton", transport="triton", endpoint=triton.url, runtime_config=names
    )
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    def params(trace: str) -> CompletionParams:
        hello = [{"role": "user", "content": "hi"}]
        return CompletionParams(CHAT, {}, "m", False, False, None, ["hi"], hello, "", traceparent=trace)

    async def call() -> None:
        client = client_for(worker)
        for trace in (traceparent, ""):
            _, usage = await client.complete(params=params(trace), max_tokens=4, request_id="r")
            assert (usage.prompt_tokens, usage.completion_tokens) == (3, 1)
        await close_client()

    asyncio.run(call())
    triton.server.shutdown()
    assert triton.traceparents == [traceparent, ""]


# redis-py 8 imports opentelemetry.sdk.metrics itself when the SDK is installed (its optional command
# metrics): that is the baseline; the gateway must load nothing beyond it, and none of the tracing SDK.
OFF_SCRIPT = """
import json, os, sys
import redis
def otel():
    return {m for m in sys.modules if m.split(".")[0] in ("opentelemetry", "google")}
baseline = otel()
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "speedinfer.settings")
django.setup()
import httpx
from tests.servers import GatewayServer
gateway = GatewayServer().start()
secret = os.environ["TRACE_TEST_SECRET"]
parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
headers = {"Authorization": "Bearer " + secret, "traceparent": parent}
statuses = []
for stream in (False, True):
    body = {"model": "acme/model-1", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    answer = httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=10)
    statuses.append(answer.status_code)
statuses.append(httpx.get(gateway.url + "/v1/models", headers={"Authorization": "Bearer nope"}).status_code)
from proxy import tracing
tracing_sdk = ("opentelemetry.sdk.trace", "opentelemetry.exporter", "opentelemetry.proto", "google.protobuf")
print(json.dumps({
    "statuses": statuses,
    "added": sorted(otel() - baseline),
    "tracing_sdk": sorted(m for m in otel() if m.startswith(tracing_sdk)),
    "enabled": tracing.enabled(),
}))
sys.stdout.flush()
os._exit(0)
"""


def test_with_the_variable_unset_nothing_of_opentelemetry_is_loaded(make_world, subprocess_env):
    world = make_world(gateway=False)
    env = {k: v for k, v in subprocess_env.items() if not k.startswith("OTEL_")}
    env["TRACE_TEST_SECRET"] = world["secret"]
    done = subprocess.run(
        [sys.executable, "-c", OFF_SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"statuses": [200, 200, 401], "added": [], "tracing_sdk": [], "enabled": False}
