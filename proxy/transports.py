"""Calling a worker: the OpenAI-compatible transport (tensorrt-llm frontends, cuda) and direct Triton.

Every failure becomes a workers.errors.WorkerError carrying CONTRACT's status
and code; upstream's own words go to `detail` (logs only: they may name hosts).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from proxy.payloads import CHAT, CompletionParams
from workers.errors import RuntimeUsageUnavailable, UpstreamError, UpstreamTimeout, WorkerError
from workers.http import get_client, worker_timeout, worker_total_timeout
from workers.routing import WorkerView

DONE = b"[DONE]"


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


def usage_from(data: Any) -> Usage | None:
    """Authoritative usage from an OpenAI `usage` object, or None when absent or malformed."""
    if not isinstance(data, dict):
        return None
    prompt, completion = data.get("prompt_tokens"), data.get("completion_tokens")
    if type(prompt) is not int or type(completion) is not int or prompt < 0 or completion < 0:
        return None
    return Usage(prompt, completion)


def _rejected(status: int, detail: str) -> UpstreamError:
    error = UpstreamError(f"the worker failed (HTTP {status})", detail=detail[:500])
    # A 4xx is the worker refusing this request, not the worker being sick.
    error.counts_against_circuit = status >= 500
    return error


def _upstream_request(worker: WorkerView, params: CompletionParams, max_tokens: int, request_id: str) -> httpx.Request:
    body = dict(params.body)
    body["model"] = worker.upstream_model(params.model)
    if body.get("max_completion_tokens") is not None:
        body["max_completion_tokens"] = max_tokens
    if body.get("max_tokens") is not None or body.get("max_completion_tokens") is None:
        body["max_tokens"] = max_tokens
    if params.stream:
        # Settlement needs the final usage event whether or not the client asked for it.
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    headers = {"content-type": "application/json", "x-request-id": request_id}
    if worker.upstream_api_key:
        headers["authorization"] = f"Bearer {worker.upstream_api_key}"
    path = "/chat/completions" if params.endpoint == CHAT else "/completions"
    return get_client().build_request(
        "POST",
        worker.endpoint + path,
        content=orjson.dumps(body),
        headers=headers,
        timeout=worker_timeout(worker.runtime_config),
    )


async def openai_complete(
    *, worker: WorkerView, params: CompletionParams, max_tokens: int, request_id: str
) -> tuple[dict[str, Any], Usage]:
    """A non-streaming call: the worker's JSON answer (model id rewritten to the public one) and its usage."""
    request = _upstream_request(worker, params, max_tokens, request_id)
    try:
        async with asyncio.timeout(worker_total_timeout(worker.runtime_config)):
            response = await get_client().send(request)
    except (httpx.TimeoutException, TimeoutError) as exc:
        raise UpstreamTimeout("the worker did not answer in time", detail=repr(exc)) from None
    except httpx.HTTPError as exc:
        raise UpstreamError("the worker could not be reached", detail=repr(exc)) from None
    if response.status_code != 200:
        raise _rejected(response.status_code, response.text)
    try:
        data = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        raise UpstreamError("the worker's answer is not JSON", detail=response.text[:500]) from None
    if not isinstance(data, dict):
        raise UpstreamError("the worker's answer is not a JSON object")
    usage = usage_from(data.get("usage"))
    if usage is None:
        raise RuntimeUsageUnavailable("the worker's answer has no usage; nothing was charged")
    data["model"] = params.model
    return data, usage


async def openai_stream_open(
    *, worker: WorkerView, params: CompletionParams, max_tokens: int, request_id: str
) -> httpx.Response:
    """Start a streaming call; the caller must close the response (that stops the worker generating)."""
    request = _upstream_request(worker, params, max_tokens, request_id)
    try:
        response = await get_client().send(request, stream=True)
    except httpx.TimeoutException as exc:
        raise UpstreamTimeout("the worker did not answer in time", detail=repr(exc)) from None
    except httpx.HTTPError as exc:
        raise UpstreamError("the worker could not be reached", detail=repr(exc)) from None
    if response.status_code != 200:
        try:
            detail = (await response.aread()).decode(errors="replace")
        except httpx.HTTPError:
            detail = ""
        finally:
            await response.aclose()
        raise _rejected(response.status_code, detail)
    return response


async def sse_data(response: httpx.Response) -> AsyncIterator[bytes]:
    """The `data` payload of each server-sent event, as it arrives (no buffering beyond one event)."""
    buffer = b""
    try:
        async for chunk in response.aiter_raw():
            buffer += chunk
            if b"\r" in buffer:
                buffer = buffer.replace(b"\r\n", b"\n")
            while True:
                end = buffer.find(b"\n\n")
                if end < 0:
                    break
                event, buffer = buffer[:end], buffer[end + 2 :]
                data = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
                if data:
                    yield data[0] if len(data) == 1 else b"\n".join(data)
    except httpx.TimeoutException as exc:
        raise UpstreamTimeout("the worker stopped answering mid-stream", detail=repr(exc)) from None
    except httpx.HTTPError as exc:
        raise UpstreamError("the worker's stream broke off", detail=repr(exc)) from None


async def triton_complete(
    *, worker: WorkerView, params: CompletionParams, max_tokens: int, request_id: str
) -> tuple[dict[str, Any], Usage]:
    """Direct Triton (HTTP v2): render the prompt, infer, and answer in OpenAI's shape."""
    from workers.triton import render_chat_prompt, triton_infer

    prompt = render_chat_prompt(params.messages, worker.runtime_config) if params.endpoint == CHAT else params.prompt
    try:
        result = await triton_infer(worker=worker, prompt=prompt, max_tokens=max_tokens)
    except WorkerError:
        raise
    except (httpx.TimeoutException, TimeoutError) as exc:
        raise UpstreamTimeout("the worker did not answer in time", detail=repr(exc)) from None
    except httpx.HTTPError as exc:
        raise UpstreamError("the worker could not be reached", detail=repr(exc)) from None
    usage = Usage(result.prompt_tokens, result.completion_tokens)
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
