"""Triton Inference Server over HTTP/REST v2 (KServe protocol): readiness, discovery and inference.

`TritonClient` is the `runtimes.interface.WorkerClient` of a direct (`/infer`) Triton worker.

Shapes handled are the ones the real server answers (see README, Workers): empty
bodies on readiness, `{"error": "..."}` on rejections with 400/404/500/501,
flat `data` in answers though requests may nest it, BYTES as UTF-8 strings.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx

from runtimes.embeddings import embeddings_answer, embeddings_config
from runtimes.errors import (
    RuntimeUsageUnavailable,
    TritonInferenceFailed,
    UpstreamError,
    WorkerError,
    WorkerRejected,
    http_failures,
    is_client_error,
    worker_message,
)
from runtimes.http import get_client, worker_timeout, worker_total_timeout
from runtimes.interface import Answer, Capabilities, WorkerClient
from runtimes.request import CHAT, CompletionParams, Usage, is_token_count
from runtimes.target import WorkerTarget

DEFAULT_CHAT_TEMPLATE = {"prefix": "", "message": "{role}: {content}\n", "suffix": "assistant:"}


@dataclass(frozen=True, slots=True)
class TritonResult:
    text: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


def _error_text(response: httpx.Response) -> str:
    """Triton's own message: `{"error": "..."}`, or the raw body."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict) and "error" in body:
        return str(body["error"])
    return response.text[:500]


# Triton's 400s that mean the registration's tensor names do not fit the model: our mistake, not the client's.
_MISCONFIGURED = ("unexpected inference", "inputs but got", "unexpected shape for input")


def triton_rejection(worker: WorkerTarget, status: int, message: str) -> WorkerError:
    """A non-200 from /infer: Triton's own words for the client's mistakes (400 invalid_request,
    e.g. a model refusing an input too long), else 502 triton_inference_failed with them in the log only."""
    if is_client_error(status) and not any(marker in message for marker in _MISCONFIGURED):
        text = worker_message(message, endpoint=worker.endpoint)
        return WorkerRejected(text or f"the Triton worker refused the request (HTTP {status})", detail=message)
    return TritonInferenceFailed(
        "the Triton worker rejected the inference request",
        detail=f"{status} {message}",
        server_fault=status >= 500,
    )


async def _request(
    method: str,
    url: str,
    *,
    http_timeout: httpx.Timeout,
    client: httpx.AsyncClient | None,
    json_body: Any = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    client = client or get_client()
    with http_failures("the Triton worker"):
        return await client.request(method, url, json=json_body, timeout=http_timeout, headers=headers)


def _trace_headers(params: CompletionParams) -> dict[str, str] | None:
    return {"traceparent": params.traceparent} if params.traceparent else None


async def _ready(url: str, *, http_timeout: httpx.Timeout, client: httpx.AsyncClient | None) -> tuple[bool, str]:
    response = await _request("GET", url, http_timeout=http_timeout, client=client)
    if response.status_code >= 500:
        raise UpstreamError(f"Triton answered {response.status_code}", detail=_error_text(response))
    if response.status_code == 200:
        return True, ""
    return False, f"{response.status_code} {_error_text(response)}".strip()


async def triton_server_ready(
    *, worker: WorkerTarget, http_timeout: httpx.Timeout, client: httpx.AsyncClient | None = None
) -> tuple[bool, str]:
    """GET /v2/health/ready: (ready, why not). Raises UpstreamError/UpstreamTimeout when unreachable or 5xx.

    Readiness is strict on Triton: 400 when any model of the repository failed to load."""
    return await _ready(f"{worker.endpoint}/v2/health/ready", http_timeout=http_timeout, client=client)


async def triton_model_ready(
    *, worker: WorkerTarget, model_name: str, http_timeout: httpx.Timeout, client: httpx.AsyncClient | None = None
) -> tuple[bool, str]:
    """GET /v2/models/{model_name}/ready: 400 `{"error":"Model version not ready"}` when unready or unknown."""
    return await _ready(f"{worker.endpoint}/v2/models/{model_name}/ready", http_timeout=http_timeout, client=client)


async def triton_repository_index(
    *, worker: WorkerTarget, http_timeout: httpx.Timeout, client: httpx.AsyncClient | None = None
) -> list[str]:
    """The names of the ready models (diagnostics only: routing needs the explicit declaration)."""
    response = await _request(
        "POST",
        f"{worker.endpoint}/v2/repository/index",
        http_timeout=http_timeout,
        client=client,
        json_body={"ready": True},
    )
    if response.status_code != 200:
        raise UpstreamError(f"Triton repository index answered {response.status_code}", detail=_error_text(response))
    try:
        entries = response.json()
    except ValueError:
        raise UpstreamError("Triton repository index is not JSON", detail=response.text[:500]) from None
    if not isinstance(entries, list):
        return []
    names = {
        str(e["name"]) for e in entries if isinstance(e, dict) and "name" in e and e.get("state", "READY") == "READY"
    }
    return sorted(names)


def _flat(data: Any) -> list[Any]:
    if isinstance(data, list):
        return [item for inner in data for item in _flat(inner)]
    return [data]


def _first(outputs: dict[str, Any], name: str) -> Any:
    output = outputs.get(name)
    if not isinstance(output, dict):
        return None
    values = _flat(output.get("data"))
    return values[0] if values and values[0] is not None else None


def _count(outputs: dict[str, Any], name: str) -> int:
    value = _first(outputs, name)
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # Triton's JSON writes some integer tensors as 3.0
    if not is_token_count(value):
        raise RuntimeUsageUnavailable(
            "the Triton worker returned no authoritative token counts",
            detail=f"output {name!r} missing or not a count: {value!r}",
        )
    return int(value)


def _text(value: Any) -> str:
    if isinstance(value, list):
        return "".join(_text(v) for v in value)
    if value is None:
        return ""
    return str(value)


def infer_request(*, config: dict[str, Any], prompt: str, max_tokens: int) -> dict[str, Any]:
    """The HTTP v2 request body of spec 002, under the worker's tensor names."""
    outputs = [
        config["output_name"],
        config["prompt_tokens_output_name"],
        config["completion_tokens_output_name"],
    ]
    if config.get("cached_tokens_output_name"):
        outputs.append(config["cached_tokens_output_name"])
    return {
        "inputs": [
            {"name": config["input_name"], "shape": [1, 1], "datatype": "BYTES", "data": [[prompt]]},
            {"name": config["max_tokens_input_name"], "shape": [1, 1], "datatype": "INT32", "data": [[max_tokens]]},
        ],
        # JSON answers (not the binary tensor extension), so the counts can be read as numbers.
        "outputs": [{"name": name, "parameters": {"binary_data": False}} for name in outputs],
    }


async def triton_infer(*, worker: WorkerTarget, prompt: str, max_tokens: int, traceparent: str = "") -> TritonResult:
    """POST /v2/models/{model_name}/infer; the text and the worker's own token counts.

    Raises TritonInferenceFailed (Triton's message in .detail; server_fault only for 5xx),
    RuntimeUsageUnavailable (no counts), UpstreamTimeout or UpstreamError."""
    config = worker.runtime_config
    url = f"{worker.endpoint}/v2/models/{config['model_name']}/infer"
    body = infer_request(config=config, prompt=prompt, max_tokens=max_tokens)
    # Triton started with --trace-config mode=opentelemetry continues the trace of a traceparent.
    headers = {"traceparent": traceparent} if traceparent else None
    with http_failures("the Triton worker"):
        async with asyncio.timeout(worker_total_timeout(config)):
            response = await _request(
                "POST", url, http_timeout=worker_timeout(config), client=None, json_body=body, headers=headers
            )
    if response.status_code != 200:
        message = _error_text(response)
        # Asking a model for an output it lacks is a 400 "unexpected inference output 'NAME'" (seen on
        # 2.51): for a count output that is a model without authoritative usage, not a bad request.
        counts = (config["prompt_tokens_output_name"], config["completion_tokens_output_name"])
        if response.status_code == 400 and any(f"unexpected inference output '{n}'" in message for n in counts):
            raise RuntimeUsageUnavailable("the Triton worker returned no authoritative token counts", detail=message)
        raise triton_rejection(worker, response.status_code, message)
    try:
        answer = response.json()
    except (ValueError, json.JSONDecodeError):
        raise TritonInferenceFailed("the Triton worker's answer is not JSON", detail=response.text[:500]) from None
    if not isinstance(answer, dict) or "error" in answer:
        detail = str(answer.get("error")) if isinstance(answer, dict) else repr(answer)[:500]
        raise TritonInferenceFailed("the Triton worker rejected the inference request", detail=detail)
    outputs: dict[str, Any] = {str(o.get("name")): o for o in answer.get("outputs") or [] if isinstance(o, dict)}
    if config["output_name"] not in outputs:
        raise TritonInferenceFailed(
            "the Triton worker's answer has no text output", detail=f"missing output {config['output_name']!r}"
        )
    text_output = outputs[config["output_name"]]
    text = _text(_flat(text_output.get("data")))
    prompt_tokens = _count(outputs, config["prompt_tokens_output_name"])
    completion_tokens = _count(outputs, config["completion_tokens_output_name"])
    cached_name = config.get("cached_tokens_output_name")
    # Cached tokens are part of the prompt: a count above it is not believed (charged as uncached).
    cached = _count(outputs, cached_name) if cached_name else 0
    return TritonResult(
        text=text,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_tokens=cached if cached <= prompt_tokens else 0,
    )


def _content(content: Any) -> str:
    """OpenAI message content: a string, or a list of parts of which the text ones count."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", "")) for part in content if isinstance(part, dict) and part.get("type") == "text"
        )
    return "" if content is None else str(content)


def render_chat_prompt(messages: list[dict[str, Any]], runtime_config: dict[str, Any]) -> str:
    """One prompt string from chat messages, for a Triton model that takes plain text.

    runtime_config.chat_template = {"prefix", "message", "suffix"} overrides the default; `message`
    is repeated per message with {role} and {content} replaced (plain replacement, so braces in
    user content are harmless)."""
    template = {**DEFAULT_CHAT_TEMPLATE, **(runtime_config.get("chat_template") or {})}
    parts = [template["prefix"]]
    for message in messages:
        role = str(message.get("role", "user"))
        parts.append(template["message"].replace("{role}", role).replace("{content}", _content(message.get("content"))))
    parts.append(template["suffix"])
    return "".join(parts)


def triton_prompt(params: CompletionParams, runtime_config: dict[str, Any]) -> str:
    """The prompt text a Triton model is sent: chat messages rendered, or the completion prompt."""
    return render_chat_prompt(params.messages, runtime_config) if params.endpoint == CHAT else params.prompt


async def triton_complete(
    *, worker: WorkerTarget, params: CompletionParams, max_tokens: int, request_id: str
) -> tuple[dict[str, Any], Usage]:
    """Direct Triton (HTTP v2): render the prompt, infer, and answer in OpenAI's shape."""
    result = await triton_infer(
        worker=worker,
        prompt=triton_prompt(params, worker.runtime_config),
        max_tokens=max_tokens,
        traceparent=params.traceparent,
    )
    return completion_answer(params=params, result=result, max_tokens=max_tokens)


def completion_answer(
    *, params: CompletionParams, result: TritonResult, max_tokens: int
) -> tuple[dict[str, Any], Usage]:
    """A Triton result as OpenAI's chat.completion or text_completion object, and its usage."""
    usage = Usage(result.prompt_tokens, result.completion_tokens, cached_tokens=result.cached_tokens)
    finish = "length" if usage.completion_tokens >= max_tokens else "stop"
    suffix = uuid.uuid4().hex[:24]
    if params.endpoint == CHAT:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": result.text},
            "logprobs": None,
            "finish_reason": finish,
        }
        head = {"id": f"chatcmpl-{suffix}", "object": "chat.completion"}
    else:
        choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": finish}
        head = {"id": f"cmpl-{suffix}", "object": "text_completion"}
    data = {
        **head,
        "created": int(time.time()),
        "model": params.model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        },
    }
    return data, usage


async def triton_embed(
    *, worker: WorkerTarget, params: CompletionParams, max_tokens: int, request_id: str
) -> tuple[dict[str, Any], Usage]:
    """POST /v2/models/{embeddings.model_name}/infer; the vectors and the model's own prompt-token count."""
    config = embeddings_config(worker)
    if config is None:
        raise WorkerRejected(f"the model '{params.model}' does not serve embeddings")
    texts = params.texts
    count_name = config["prompt_tokens_output_name"]
    body = {
        "inputs": [
            {
                "name": config["input_name"],
                "shape": [len(texts), 1],
                "datatype": "BYTES",
                "data": [[text] for text in texts],
            }
        ],
        "outputs": [
            {"name": name, "parameters": {"binary_data": False}} for name in (config["output_name"], count_name)
        ],
    }
    url = f"{worker.endpoint}/v2/models/{config['model_name']}/infer"
    timeouts = worker.runtime_config
    with http_failures("the Triton worker"):
        async with asyncio.timeout(worker_total_timeout(timeouts)):
            response = await get_client().post(
                url, json=body, timeout=worker_timeout(timeouts), headers=_trace_headers(params)
            )
    if response.status_code != 200:
        message = _error_text(response)
        if response.status_code == 400 and f"unexpected inference output '{count_name}'" in message:
            raise RuntimeUsageUnavailable("the Triton worker returned no authoritative token counts", detail=message)
        raise triton_rejection(worker, response.status_code, message)
    try:
        answer = response.json()
    except (ValueError, json.JSONDecodeError):
        raise TritonInferenceFailed("the Triton worker's answer is not JSON", detail=response.text[:500]) from None
    outputs = {
        str(o.get("name")): o for o in (answer.get("outputs") or []) if isinstance(answer, dict) and isinstance(o, dict)
    }
    vectors = _vectors(outputs.get(config["output_name"]), len(texts))
    prompt_tokens = _total(outputs.get(count_name), count_name)
    encoding_format = str(params.body.get("encoding_format") or "float")
    data = embeddings_answer(
        model=params.model, vectors=vectors, prompt_tokens=prompt_tokens, encoding_format=encoding_format
    )
    return data, Usage(prompt_tokens, 0)


def _vectors(output: Any, count: int) -> list[list[float]]:
    if not isinstance(output, dict):
        raise TritonInferenceFailed("the Triton worker's answer has no embedding output")
    values = _flat(output.get("data"))
    if not values or count == 0 or len(values) % count or not all(isinstance(v, int | float) for v in values):
        raise TritonInferenceFailed(
            "the Triton worker's embedding output is not one vector per input",
            detail=f"{len(values)} values for {count} inputs, shape {output.get('shape')!r}",
        )
    size = len(values) // count
    return [[float(v) for v in values[i * size : (i + 1) * size]] for i in range(count)]


def _total(output: Any, name: str) -> int:
    values = _flat(output.get("data")) if isinstance(output, dict) else []
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values):
        raise RuntimeUsageUnavailable(
            "the Triton worker returned no authoritative token counts",
            detail=f"output {name!r} missing or not counts",
        )
    return sum(values)


class TritonClient(WorkerClient):
    """Direct Triton over HTTP v2 `/infer`: one answer per request, no streaming, and none of the
    request features it cannot honour (tools, response_format, n > 1, logprobs, media)."""

    transport = "triton"

    @classmethod
    def capabilities_of(cls, worker: WorkerTarget) -> Capabilities:
        # A worker registered for embeddings only has no text-generation tensor names.
        generates = bool(worker.runtime_config.get("model_name"))
        return Capabilities(generates_text=generates, embeds=embeddings_config(worker) is not None)

    async def complete(self, *, params: CompletionParams, max_tokens: int, request_id: str) -> Answer:
        if not self.capabilities.generates_text:
            return await super().complete(params=params, max_tokens=max_tokens, request_id=request_id)
        return await triton_complete(worker=self.worker, params=params, max_tokens=max_tokens, request_id=request_id)

    async def embed(self, *, params: CompletionParams, max_tokens: int, request_id: str) -> Answer:
        return await triton_embed(worker=self.worker, params=params, max_tokens=max_tokens, request_id=request_id)
