"""Triton's generate extension for decoupled models: `POST /v2/models/{model_name}/generate_stream`.

A Triton worker opts in with `runtime_config.streaming = "generate_stream"` (TensorRT-LLM's ensemble,
any decoupled model). The body is flat JSON under the worker's input names plus `"stream": true`;
Triton answers server-sent events `data: {...}` holding every output by name, a last
`data: {"error": "..."}` on failure (after a 200), and no `[DONE]`: the stream ends when the
connection closes (seen on 2.51, see /work/shared/TRITON_ON_CPU.md).

`triton_stream_chunks` turns those events into OpenAI chunk payloads, the same bytes `sse_data` yields
from an OpenAI-compatible worker, so the gateway relays both transports one way. The counts are the
ones in the last event that carries them (TensorRT-LLM's `num_input_tokens`/`num_output_tokens` count
the whole request so far). Non-streaming requests use the same endpoint and join the events' text:
Triton's `/infer` refuses decoupled models (501), and `/generate` wants exactly one response.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson

from runtimes.errors import RuntimeUsageUnavailable, TritonInferenceFailed, http_failures
from runtimes.http import get_client, worker_timeout, worker_total_timeout
from runtimes.interface import DONE, Answer, Capabilities, WorkerStream
from runtimes.request import CHAT, CompletionParams, Usage
from runtimes.sse import sse_data
from runtimes.target import WorkerTarget
from runtimes.triton import TritonClient, TritonResult, completion_answer, triton_prompt

GENERATE_STREAM = "generate_stream"


def generate_body(*, config: dict[str, Any], prompt: str, max_tokens: int) -> dict[str, Any]:
    """The generate extension's flat body: runtime_config.generate_inputs (e.g. TensorRT-LLM's
    return_num_input_tokens), then the prompt, the token limit and `stream` under their names."""
    body: dict[str, Any] = dict(config.get("generate_inputs") or {})
    body[config["input_name"]] = prompt
    body[config["max_tokens_input_name"]] = max_tokens
    body["stream"] = True
    return body


async def triton_stream_open(
    *, worker: WorkerTarget, params: CompletionParams, max_tokens: int, request_id: str
) -> httpx.Response:
    """Start a generate_stream call; the caller must close the response (that cancels the request on Triton)."""
    config = worker.runtime_config
    body = generate_body(config=config, prompt=triton_prompt(params, config), max_tokens=max_tokens)
    client = get_client()
    request = client.build_request(
        "POST",
        f"{worker.endpoint}/v2/models/{config['model_name']}/generate_stream",
        content=orjson.dumps(body),
        headers={
            "content-type": "application/json",
            **({"traceparent": params.traceparent} if params.traceparent else {}),
        },
        timeout=worker_timeout(config),
    )
    with http_failures("the Triton worker"):
        response = await client.send(request, stream=True)
    if response.status_code != 200:
        try:
            detail = (await response.aread()).decode(errors="replace")[:500]
        except httpx.HTTPError:
            detail = ""
        finally:
            await response.aclose()
        raise TritonInferenceFailed(
            "the Triton worker rejected the inference request",
            detail=f"{response.status_code} {detail}",
            server_fault=response.status_code >= 500,
        )
    return response


def _scalar(value: Any) -> Any:
    # One-element tensors arrive as scalars, longer ones as (possibly nested) lists.
    while isinstance(value, list) and value:
        value = value[0]
    return value


def _count(event: dict[str, Any], name: str) -> int | None:
    value = _scalar(event.get(name))
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or int(value) != value:
        return None
    return int(value)


def _text(value: Any) -> str:
    if isinstance(value, list):
        return "".join(_text(v) for v in value)
    return "" if value is None else str(value)


async def triton_events(response: httpx.Response, config: dict[str, Any]) -> AsyncIterator[tuple[str, Usage | None]]:
    """(text, counts or None) per event, as it arrives. Raises TritonInferenceFailed on an error event
    or an unreadable one, UpstreamError/UpstreamTimeout when the stream breaks."""
    prompt_name, completion_name = config["prompt_tokens_output_name"], config["completion_tokens_output_name"]
    async for payload in sse_data(response):
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise TritonInferenceFailed(
                "the Triton worker sent an event that is not JSON", detail=payload[:200].decode(errors="replace")
            ) from None
        if not isinstance(event, dict) or "error" in event:
            raise TritonInferenceFailed(
                "the Triton worker failed mid-stream", detail=payload[:500].decode(errors="replace")
            )
        prompt_tokens, completion_tokens = _count(event, prompt_name), _count(event, completion_name)
        counts = None if prompt_tokens is None or completion_tokens is None else Usage(prompt_tokens, completion_tokens)
        yield _text(event.get(config["output_name"])), counts


def _no_counts() -> RuntimeUsageUnavailable:
    return RuntimeUsageUnavailable("the Triton worker returned no authoritative token counts; nothing was charged")


async def triton_stream_chunks(
    response: httpx.Response, *, worker: WorkerTarget, params: CompletionParams, max_tokens: int
) -> AsyncIterator[bytes]:
    """OpenAI chunk payloads from a generate_stream response: one per event with text, the moment it
    arrives; then a finish chunk, a usage chunk (`choices: []`) and `[DONE]`. Raises
    RuntimeUsageUnavailable when no event carried the counts (before the finish chunk)."""
    chat = params.endpoint == CHAT
    head = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": params.model,
    }

    def chunk(text: str | None, finish: str | None = None, *, first: bool = False) -> bytes:
        if chat:
            delta: dict[str, Any] = {} if text is None else {"content": text}
            if first:
                delta = {"role": "assistant", **delta}
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return orjson.dumps({**head, "choices": [choice]})

    usage: Usage | None = None
    sent = 0
    async for text, counts in triton_events(response, worker.runtime_config):
        if counts is not None:
            usage = counts
        if text:
            yield chunk(text, first=sent == 0)
            sent += 1
    if usage is None:
        raise _no_counts()
    yield chunk(None, "length" if usage.completion_tokens >= max_tokens else "stop", first=sent == 0)
    total = usage.prompt_tokens + usage.completion_tokens
    yield orjson.dumps(
        {
            **head,
            "choices": [],
            "usage": {
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "total_tokens": total,
            },
        }
    )
    yield DONE


async def triton_stream_complete(
    *, worker: WorkerTarget, params: CompletionParams, max_tokens: int, request_id: str
) -> tuple[dict[str, Any], Usage]:
    """A non-streaming request to a streaming Triton worker: the events' text joined, the last counts."""
    config = worker.runtime_config
    parts: list[str] = []
    usage: Usage | None = None
    with http_failures("the Triton worker"):
        async with asyncio.timeout(worker_total_timeout(config)):
            response = await triton_stream_open(
                worker=worker, params=params, max_tokens=max_tokens, request_id=request_id
            )
            try:
                async for text, counts in triton_events(response, config):
                    parts.append(text)
                    usage = counts or usage
            finally:
                await response.aclose()
    if usage is None:
        raise _no_counts()
    result = TritonResult(
        text="".join(parts), prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens
    )
    return completion_answer(params=params, result=result, max_tokens=max_tokens)


class TritonStreamClient(TritonClient):
    """A Triton worker that opted in to generate_stream: it streams, and non-streaming requests take
    the same endpoint (its decoupled model refuses /infer). Embeddings as any Triton worker."""

    @classmethod
    def serves(cls, worker: WorkerTarget) -> bool:
        """A Triton worker that opted in (`runtime_config.streaming = "generate_stream"`)."""
        return worker.runtime_config.get("streaming") == GENERATE_STREAM

    @classmethod
    def capabilities_of(cls, worker: WorkerTarget) -> Capabilities:
        base = TritonClient.capabilities_of(worker)
        return Capabilities(generates_text=True, streams=True, embeds=base.embeds)

    async def complete(self, *, params: CompletionParams, max_tokens: int, request_id: str) -> Answer:
        return await triton_stream_complete(
            worker=self.worker, params=params, max_tokens=max_tokens, request_id=request_id
        )

    async def stream_open(self, *, params: CompletionParams, max_tokens: int, request_id: str) -> WorkerStream:
        worker = self.worker
        response = await triton_stream_open(worker=worker, params=params, max_tokens=max_tokens, request_id=request_id)
        return WorkerStream(
            triton_stream_chunks(response, worker=worker, params=params, max_tokens=max_tokens), response.aclose
        )
