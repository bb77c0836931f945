"""Calling a worker: the one interface every transport implements, and the capabilities it declares.

Modelled on httpx's `AsyncBaseTransport`: a small base class whose methods a transport overrides. The
gateway (proxy/) holds a `WorkerClient` from `runtimes.client.client_for(worker)` and never names a
transport: what a worker can do is read from `client.capabilities`, and a method the transport lacks
raises `WorkerRejected` (400 invalid_request; nothing charged, the worker not counted as sick).

    complete(params, max_tokens, request_id) -> (OpenAI answer dict, Usage)    chat / completions
    stream_open(params, max_tokens, request_id) -> WorkerStream                 stream: true
    embed(params, max_tokens, request_id) -> (OpenAI embeddings answer, Usage)  /v1/embeddings
    respond(params, max_tokens, request_id) -> (Response object, Usage)          /v1/responses
    respond_stream(params, max_tokens, request_id) -> WorkerStream (Responses events)
    rerank(params, max_tokens, request_id) -> (rerank answer, Usage)            /v1/rerank

`respond` / `respond_stream` are served by every worker that generates text: by default they translate
the Responses request to chat completions and back (runtimes.responses) through `complete` /
`stream_open`; a transport whose worker speaks the Responses API itself (`Capabilities.responses`)
overrides them to forward it as it is.

Every method sends `params.traceparent`, when set, as the worker request's W3C `traceparent` header (the
gateway's span of that call, proxy.tracing), so a worker that traces joins the request's trace.

Adding to it (the next issues):
- a new endpoint (Responses API, rerank): a method here that raises `_lacks(...)` by default, a flag in
  `Capabilities` (default False), and an override in the transports that serve it;
- a request feature (media parts, tools, n, logprobs...): its flag in `Capabilities`, set honestly by each
  transport's `capabilities_of`; the gateway refuses by flag, never by transport;
- a new transport: `runtimes/<name>.py` with a `WorkerClient` subclass, one line in `runtimes/client.py`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson

from runtimes.errors import WorkerRejected
from runtimes.http import worker_timeout, worker_total_timeout
from runtimes.request import CompletionParams, Usage
from runtimes.responses import ResponseEvents, chat_params, response_from_chat
from runtimes.target import WorkerTarget

Answer = tuple[dict[str, Any], Usage]
DONE = b"[DONE]"  # the last payload of every WorkerStream


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a worker serves. Every flag defaults to False: a transport claims only what it honours."""

    generates_text: bool = False  # chat and completions (complete)
    streams: bool = False  # stream: true (stream_open)
    embeds: bool = False  # /v1/embeddings (embed)
    tools: bool = False  # tools / tool_choice are passed through and honoured
    response_format: bool = False  # response_format (JSON mode, schemas) is honoured
    media: bool = False  # image / audio content parts in chat messages
    n: bool = False  # n > 1 choices
    logprobs: bool = False  # logprobs / top_logprobs
    prompt_arrays: bool = False  # a batch of prompts, or token ids (completions' prompt, embeddings' input)
    responses: bool = False  # the Responses API (POST /v1/responses)
    rerank: bool = False  # POST /v1/rerank


class WorkerStream:
    """An open upstream stream: `payloads` yields each OpenAI chunk payload (the JSON of one
    `chat.completion.chunk` / `text_completion` event, then `DONE`; for `respond_stream`, the JSON of
    each Responses stream event), as it arrives.
    The caller must `aclose()` it: that closes the upstream request, so the worker stops generating."""

    __slots__ = ("payloads", "_close")

    def __init__(self, payloads: AsyncIterator[bytes], close: Callable[[], Awaitable[None]]) -> None:
        self.payloads = payloads
        self._close = close

    async def aclose(self) -> None:
        await self._close()


def _lacks(params: CompletionParams, what: str) -> WorkerRejected:
    return WorkerRejected(f"the model '{params.model}' {what}")


class WorkerClient:
    """One worker, called through its transport. Subclasses set `transport` (the registry's key) and
    override `capabilities_of` and the methods they serve; the rest refuse with WorkerRejected."""

    transport: ClassVar[str] = ""

    def __init__(self, worker: WorkerTarget) -> None:
        self.worker = worker
        self.capabilities = self.capabilities_of(worker)

    @classmethod
    def serves(cls, worker: WorkerTarget) -> bool:
        """Whether this client calls `worker` (a variant of a transport narrows it by runtime_config)."""
        return True

    @classmethod
    def capabilities_of(cls, worker: WorkerTarget) -> Capabilities:
        return Capabilities()

    @property
    def total_timeout(self) -> float:
        """Seconds the whole call may take (a stream: from its open to its last event)."""
        return worker_total_timeout(self.worker.runtime_config)

    @property
    def idle_timeout(self) -> float:
        """Seconds a stream may go without a data event (its first included)."""
        return worker_timeout(self.worker.runtime_config).read or self.total_timeout

    async def complete(self, *, params: CompletionParams, max_tokens: int, request_id: str) -> Answer:
        raise _lacks(params, "serves embeddings only (POST /v1/embeddings)")

    async def stream_open(self, *, params: CompletionParams, max_tokens: int, request_id: str) -> WorkerStream:
        raise _lacks(params, "is served by workers that do not stream; send stream: false")

    async def embed(self, *, params: CompletionParams, max_tokens: int, request_id: str) -> Answer:
        raise _lacks(params, "does not serve embeddings")

    async def respond(self, *, params: CompletionParams, max_tokens: int, request_id: str) -> Answer:
        """The Responses API through chat completions (runtimes.responses): translate, complete, translate back."""
        answer, usage = await self.complete(params=chat_params(params), max_tokens=max_tokens, request_id=request_id)
        return response_from_chat(answer=answer, usage=usage, body=params.body, model=params.model), usage

    async def respond_stream(self, *, params: CompletionParams, max_tokens: int, request_id: str) -> WorkerStream:
        """Responses stream events made from the chat completion chunks of `stream_open`."""
        upstream = await self.stream_open(params=chat_params(params), max_tokens=max_tokens, request_id=request_id)
        events = ResponseEvents(body=params.body, model=params.model)
        return WorkerStream(_translated(upstream, events), upstream.aclose)

    async def rerank(self, *, params: CompletionParams, max_tokens: int, request_id: str) -> Answer:
        raise _lacks(params, "is not served by a worker that reranks")


async def _translated(upstream: WorkerStream, events: ResponseEvents) -> AsyncIterator[bytes]:
    """The Responses events of a chat stream. response.created waits for the worker's first chunk, so
    the gateway's first-event timeout and its retry on another worker still judge the worker."""
    started = False
    async for payload in upstream.payloads:
        if payload == DONE:
            break
        if not started:
            started = True
            for event in events.start():
                yield orjson.dumps(event)
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            yield payload  # the gateway reports it as the worker's fault
            return
        if not isinstance(chunk, dict) or "error" in chunk:
            yield payload
            return
        for event in events.feed(chunk):
            yield orjson.dumps(event)
    if events.usage is not None:
        # Without the worker's usage there is no response.completed: the gateway charges nothing.
        for event in events.finish():
            yield orjson.dumps(event)
    yield DONE
