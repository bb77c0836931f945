"""OpenAI-compatible workers (transport `openai`: every `cuda` worker, TensorRT-LLM's OpenAI frontend).

Chat and completions calls (plain and streaming), embeddings, and model discovery for the probes;
`OpenAIClient` is their `runtimes.interface.WorkerClient`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson

from runtimes.errors import (
    RuntimeUsageUnavailable,
    UpstreamError,
    WorkerError,
    WorkerRejected,
    http_failures,
    is_client_error,
    openai_error_message,
    worker_message,
)
from runtimes.http import Post, get_client, post_read, worker_timeout, worker_total_timeout
from runtimes.interface import Answer, Capabilities, WorkerClient, WorkerStream
from runtimes.request import CHAT, CompletionParams, Usage, usage_from
from runtimes.responses import usage_of_response
from runtimes.sse import sse_data
from runtimes.target import WorkerTarget


def auth_headers(worker: WorkerTarget) -> dict[str, str]:
    """The worker's own credential, when it has one (never logged)."""
    return {"Authorization": f"Bearer {worker.upstream_api_key}"} if worker.upstream_api_key else {}


async def openai_models(
    *, worker: WorkerTarget, http_timeout: httpx.Timeout, client: httpx.AsyncClient | None = None
) -> tuple[list[str] | None, str]:
    """GET {endpoint}/models: (the model ids it serves, "") or (None, why) on a 4xx or an unreadable answer.

    Raises UpstreamError/UpstreamTimeout when unreachable or on a 5xx (worker faults)."""
    client = client or get_client()
    with http_failures():
        response = await client.get(f"{worker.endpoint}/models", headers=auth_headers(worker), timeout=http_timeout)
    if response.status_code >= 500:
        raise UpstreamError(f"/models answered {response.status_code}", detail=response.text[:500])
    if response.status_code != 200:
        return None, f"/models answered {response.status_code}"
    try:
        body = response.json()
    except ValueError:
        return None, "/models answered something that is not JSON"
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return None, "/models has no data list"
    return [str(item["id"]) for item in data if isinstance(item, dict) and "id" in item], ""


def rejected(worker: WorkerTarget, status: int, detail: str) -> WorkerError:
    """A worker's non-200 answer: its own words for the client's mistakes (400 invalid_request),
    else 502 upstream_error with its words kept for the log."""
    if is_client_error(status):
        message = worker_message(openai_error_message(detail) or detail, endpoint=worker.endpoint)
        return WorkerRejected(message or f"the worker refused the request (HTTP {status})", detail=detail[:500])
    error = UpstreamError(f"the worker failed (HTTP {status})", detail=detail[:500])
    # A 4xx is the worker refusing this request, not the worker being sick.
    error.counts_against_circuit = status >= 500
    return error


def _upstream_request(worker: WorkerTarget, params: CompletionParams, max_tokens: int, request_id: str) -> Post:
    body = dict(params.body)
    body["model"] = worker.upstream_model(params.model)
    if body.get("max_completion_tokens") is not None:
        body["max_completion_tokens"] = max_tokens
    if body.get("max_tokens") is not None or body.get("max_completion_tokens") is None:
        body["max_tokens"] = max_tokens
    if params.stream:
        # Settlement needs the final usage event whether or not the client asked for it.
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    headers = {"content-type": "application/json", "x-request-id": request_id, **auth_headers(worker)}
    if params.traceparent:
        headers["traceparent"] = params.traceparent
    path = "/chat/completions" if params.endpoint == CHAT else "/completions"
    return Post(worker.endpoint + path, orjson.dumps(body), headers, worker_timeout(worker.runtime_config))


async def send_for_json(worker: WorkerTarget, post: Post) -> dict[str, Any]:
    """Send a non-streaming request within the worker's total timeout; its JSON object answer, or a WorkerError."""
    with http_failures():
        async with asyncio.timeout(worker_total_timeout(worker.runtime_config)):
            status, content = await post_read(post)
    if status != 200:
        raise rejected(worker, status, content.decode(errors="replace"))
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        raise UpstreamError("the worker's answer is not JSON", detail=content[:500].decode(errors="replace")) from None
    if not isinstance(data, dict):
        raise UpstreamError("the worker's answer is not a JSON object")
    return data


async def openai_complete(
    *, worker: WorkerTarget, params: CompletionParams, max_tokens: int, request_id: str
) -> tuple[dict[str, Any], Usage]:
    """A non-streaming call: the worker's JSON answer (model id rewritten to the public one) and its usage."""
    request = _upstream_request(worker, params, max_tokens, request_id)
    data = await send_for_json(worker, request)
    usage = usage_from(data.get("usage"))
    if usage is None:
        raise RuntimeUsageUnavailable("the worker's answer has no usage; nothing was charged")
    data["model"] = params.model
    return data, usage


async def _open_stream(worker: WorkerTarget, post: Post) -> httpx.Response:
    """Send a streaming request; the open response, or the worker's refusal as a WorkerError."""
    with http_failures():
        response = await get_client().send(post.request(), stream=True)
    if response.status_code != 200:
        try:
            detail = (await response.aread()).decode(errors="replace")
        except httpx.HTTPError:
            detail = ""
        finally:
            await response.aclose()
        raise rejected(worker, response.status_code, detail)
    return response


async def openai_stream_open(
    *, worker: WorkerTarget, params: CompletionParams, max_tokens: int, request_id: str
) -> httpx.Response:
    """Start a streaming call; the caller must close the response (that stops the worker generating)."""
    return await _open_stream(worker, _upstream_request(worker, params, max_tokens, request_id))


async def openai_embed(
    *, worker: WorkerTarget, params: CompletionParams, max_tokens: int, request_id: str
) -> tuple[dict[str, Any], Usage]:
    """POST {endpoint}/embeddings, the body as the client sent it but for the worker's model id."""
    body = dict(params.body)
    body["model"] = worker.upstream_model(params.model)
    headers = {"content-type": "application/json", "x-request-id": request_id, **auth_headers(worker)}
    if params.traceparent:
        headers["traceparent"] = params.traceparent
    post = Post(worker.endpoint + "/embeddings", orjson.dumps(body), headers, worker_timeout(worker.runtime_config))
    data = await send_for_json(worker, post)
    usage = data.get("usage")
    prompt_tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    if type(prompt_tokens) is not int or prompt_tokens < 0:
        raise RuntimeUsageUnavailable("the worker's answer has no usage; nothing was charged")
    data["model"] = params.model
    return data, Usage(prompt_tokens, 0)


def _post(worker: WorkerTarget, path: str, body: dict[str, Any], request_id: str) -> Post:
    headers = {"content-type": "application/json", "x-request-id": request_id, **auth_headers(worker)}
    return Post(worker.endpoint + path, orjson.dumps(body), headers, worker_timeout(worker.runtime_config))


def _responses_request(worker: WorkerTarget, params: CompletionParams, max_tokens: int, request_id: str) -> Post:
    """POST {endpoint}/responses, the client's body but for the worker's model id, the bound's token limit
    and `store: false` (the Responses API's default is to store; this service keeps no state)."""
    body = {**params.body, "model": worker.upstream_model(params.model), "max_output_tokens": max_tokens}
    body["store"] = False
    return _post(worker, "/responses", body, request_id)


async def openai_respond(
    *, worker: WorkerTarget, params: CompletionParams, max_tokens: int, request_id: str
) -> tuple[dict[str, Any], Usage]:
    """The Responses API forwarded to a worker that serves it: its Response object and usage."""
    data = await send_for_json(worker, _responses_request(worker, params, max_tokens, request_id))
    usage = usage_of_response(data)
    if usage is None:
        raise RuntimeUsageUnavailable("the worker's answer has no usage; nothing was charged")
    data["model"] = params.model
    return data, usage


async def openai_rerank(
    *, worker: WorkerTarget, params: CompletionParams, max_tokens: int, request_id: str
) -> tuple[dict[str, Any], Usage]:
    """POST {endpoint}/rerank (vLLM's and Jina's shape), settled from usage.prompt_tokens or total_tokens."""
    body = {**params.body, "model": worker.upstream_model(params.model)}
    data = await send_for_json(worker, _post(worker, "/rerank", body, request_id))
    usage = data.get("usage")
    tokens = None
    if isinstance(usage, dict):
        tokens = usage.get("prompt_tokens") if usage.get("prompt_tokens") is not None else usage.get("total_tokens")
    if type(tokens) is not int or tokens < 0 or not isinstance(data.get("results"), list):
        raise RuntimeUsageUnavailable("the worker's rerank answer has no usage or results; nothing was charged")
    data["model"] = params.model
    return data, Usage(tokens, 0)


class OpenAIClient(WorkerClient):
    """An OpenAI-compatible worker: the client's body is forwarded as it is (model id and token limit
    rewritten), so every request feature the worker honours passes through. The Responses API is
    declared per worker (`runtime_config.responses: true`: forwarded as it is; otherwise translated to
    chat completions by the interface's default); rerank is forwarded to {endpoint}/rerank."""

    transport = "openai"

    @classmethod
    def capabilities_of(cls, worker: WorkerTarget) -> Capabilities:
        return Capabilities(
            generates_text=True,
            streams=True,
            embeds=True,
            tools=True,
            response_format=True,
            media=True,
            n=True,
            logprobs=True,
            prompt_arrays=True,
            responses=worker.runtime_config.get("responses") is True,
            rerank=True,
        )

    async def complete(self, *, params: CompletionParams, max_tokens: int, request_id: str) -> Answer:
        return await openai_complete(worker=self.worker, params=params, max_tokens=max_tokens, request_id=request_id)

    async def stream_open(self, *, params: CompletionParams, max_tokens: int, request_id: str) -> WorkerStream:
        response = await openai_stream_open(
            worker=self.worker, params=params, max_tokens=max_tokens, request_id=request_id
        )
        return WorkerStream(sse_data(response), response.aclose)

    async def embed(self, *, params: CompletionParams, max_tokens: int, request_id: str) -> Answer:
        return await openai_embed(worker=self.worker, params=params, max_tokens=max_tokens, request_id=request_id)

    async def respond(self, *, params: CompletionParams, max_tokens: int, request_id: str) -> Answer:
        if not self.capabilities.responses:
            return await super().respond(params=params, max_tokens=max_tokens, request_id=request_id)
        return await openai_respond(worker=self.worker, params=params, max_tokens=max_tokens, request_id=request_id)

    async def respond_stream(self, *, params: CompletionParams, max_tokens: int, request_id: str) -> WorkerStream:
        if not self.capabilities.responses:
            return await super().respond_stream(params=params, max_tokens=max_tokens, request_id=request_id)
        response = await _open_stream(self.worker, _responses_request(self.worker, params, max_tokens, request_id))
        return WorkerStream(sse_data(response), response.aclose)

    async def rerank(self, *, params: CompletionParams, max_tokens: int, request_id: str) -> Answer:
        return await openai_rerank(worker=self.worker, params=params, max_tokens=max_tokens, request_id=request_id)
