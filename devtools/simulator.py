"""A small, fast OpenAI-compatible worker: the demo's GPU worker, the tests' upstream and the benchmark's.

    python -m devtools.simulator --port 8100 [--latency-ms 20] [--deltas 16] [--delay-ms 0] [--model acme/model-1]
                                 [--max-concurrency 4]

It serves GET /v1/models, POST /v1/chat/completions, POST /v1/completions, POST /v1/embeddings and
POST /v1/rerank (vLLM's shape), streaming and not, with `usage` (prompt tokens counted as
whitespace-separated words, one completion token per delta) and `stream_options.include_usage`.
A chat request with `tools` and `tool_choice` "required" (or naming a function) is answered with one
call of that function (the first tool for "required"), its arguments `{"text": "<the words>"}`.
It does not serve the Responses API: the gateway translates it to chat completions.

A GPU serves a bounded batch: with `--max-concurrency N` at most N requests run
at once and the rest wait in a queue (their latency then grows with load, as on
a real runtime). GET /metrics publishes the load vLLM-style, in Prometheus text:
`vllm:num_requests_running`, `vllm:num_requests_waiting` and
`vllm:request_success_total` (a worker's `runtime_config.metrics_url` may point
at `http://HOST:PORT/metrics`).

Misbehaviour for tests is asked for per request by a directive anywhere in the
prompt text, e.g. "[sim latency=50 deltas=8 delay=20 status=500 no-usage cut=3 hang]":

- latency=MS   wait before answering (before the first byte)
- deltas=N     completion tokens to produce (still capped by max_tokens)
- delay=MS     wait between stream chunks
- status=CODE  answer with that HTTP status and an OpenAI error body
- no-usage     leave usage out (non-streaming: no field; streaming: no usage chunk)
- cut=N        streaming: drop the connection after N content deltas
- hang         never answer (for timeouts)
- usage=P,C    report these counts verbatim as JSON values (e.g. usage=1000000,2147483648 or usage=1.5,2)
- comments     streaming: send the headers, then only SSE comments, forever

The same knobs exist as constructor arguments / CLI flags for a whole worker.

A GPU model (`--kv-blocks N`, off by default so the plain simulator's timing is unchanged): the prompt
text (messages' text in order, or the prompt) is cut into 64-character blocks (16 tokens at about 4
characters a token) with a chained hash, and the worker keeps an LRU prefix KV cache of N blocks. A
request's leading run of cached blocks is reused: prefill takes `--prefill-ms` per uncached block, decode
`--decode-ms` per completion token, inside the batch slot (`--max-concurrency`). Usage reports
`prompt_tokens_details.cached_tokens` (16 a cached block), and /metrics adds `vllm:gpu_cache_usage_perc`
and the prefix-cache counters `vllm:prefix_cache_queries_total` / `vllm:prefix_cache_hits_total` (tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import math
import re
import socket
import struct
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Self

import orjson
from aiohttp import web

_DIRECTIVE = re.compile(r"\[sim([^\]]*)\]")
_WORDS = ("Speed", "Infer", " routes", " every", " request", " to", " a", " healthy", " GPU", " worker", ".")


@dataclass(frozen=True)
class Behaviour:
    latency_ms: float = 0.0
    deltas: int = 16
    delay_ms: float = 0.0
    status: int = 200
    omit_usage: bool = False
    cut_after: int | None = None
    hang: bool = False
    usage: tuple[Any, Any] | None = None
    comments_only: bool = False


@dataclass(frozen=True)
class GpuModel:
    """A block-level prefix KV cache with a capacity, and prefill/decode timing (module docstring)."""

    kv_blocks: int = 4096
    prefill_ms_per_block: float = 2.0
    decode_ms_per_token: float = 1.0


BLOCK_CHARS = 64
TOKENS_PER_BLOCK = 16


class _PrefixCache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.blocks: OrderedDict[int, None] = OrderedDict()
        self.queried_tokens = 0
        self.hit_tokens = 0

    def admit(self, text: str) -> tuple[int, int]:
        """(cached blocks, all blocks) of the prompt; its blocks are then cached, the oldest evicted."""
        hashes: list[int] = []
        previous = 0
        for i in range(len(text) // BLOCK_CHARS):
            previous = hash((previous, text[i * BLOCK_CHARS : (i + 1) * BLOCK_CHARS]))
            hashes.append(previous)
        cached = 0
        for h in hashes:
            if h not in self.blocks:
                break
            cached += 1
        for h in hashes:
            self.blocks[h] = None
            self.blocks.move_to_end(h)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)
        self.queried_tokens += len(hashes) * TOKENS_PER_BLOCK
        self.hit_tokens += cached * TOKENS_PER_BLOCK
        return cached, len(hashes)

    def usage(self) -> float:
        return len(self.blocks) / self.capacity if self.capacity else 0.0


@dataclass
class SimulatorStats:
    requests: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=200))
    streams_finished: int = 0
    streams_abandoned: int = 0  # the reader went away before the end: the gateway stopped the GPU
    completed: int = 0  # answers begun with a 200 (every one, unlike `requests`, which keeps the last 200)
    running: int = 0
    waiting: int = 0
    peak_running: int = 0  # the most requests it ever ran at once
    cached_blocks: int = 0  # GPU model: prompt blocks found in the prefix cache, and all prompt blocks
    prompt_blocks: int = 0


def _texts(body: dict[str, Any]) -> list[str]:
    if "messages" in body:
        texts = []
        for message in body.get("messages") or []:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                texts.append(content)
            elif isinstance(content, list):
                texts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
        return texts
    prompt = body.get("prompt", "")
    return [prompt] if isinstance(prompt, str) else [str(p) for p in prompt]


def _behaviour(base: Behaviour, texts: list[str]) -> Behaviour:
    found = [m.group(1) for t in texts for m in _DIRECTIVE.finditer(t)]
    if not found:
        return base
    changes: dict[str, Any] = {}
    for word in " ".join(found).split():
        name, _, value = word.partition("=")
        if name == "latency":
            changes["latency_ms"] = float(value)
        elif name == "deltas":
            changes["deltas"] = int(value)
        elif name == "delay":
            changes["delay_ms"] = float(value)
        elif name == "status":
            changes["status"] = int(value)
        elif name == "no-usage":
            changes["omit_usage"] = True
        elif name == "cut":
            changes["cut_after"] = int(value)
        elif name == "hang":
            changes["hang"] = True
        elif name == "usage":
            prompt, _, completion = value.partition(",")
            changes["usage"] = (orjson.loads(prompt), orjson.loads(completion))
        elif name == "comments":
            changes["comments_only"] = True
    return replace(base, **changes)


class Simulator:
    """The aiohttp application and its knobs; `SimulatorThread` runs one on a free port."""

    def __init__(
        self,
        *,
        models: tuple[str, ...] = ("acme/model-1",),
        behaviour: Behaviour | None = None,
        api_key: str = "",
        max_concurrency: int = 0,
        gpu: GpuModel | None = None,
    ) -> None:
        self.models = models
        self.gpu = gpu
        self.cache = _PrefixCache(gpu.kv_blocks) if gpu is not None else None
        self.behaviour = behaviour or Behaviour()
        self.api_key = api_key
        self.max_concurrency = max_concurrency  # 0: unbounded
        self._slots: asyncio.Semaphore | None = None  # made on the serving loop, at first use
        self.stats = SimulatorStats()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_post("/v1/rerank", self.rerank)
        app.router.add_get("/metrics", self.metrics)
        return app

    async def metrics(self, request: web.Request) -> web.Response:
        stats = self.stats
        text = (
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="{self.models[0]}"}} {stats.running}\n'
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{model_name="{self.models[0]}"}} {stats.waiting}\n'
            "# HELP vllm:request_success_total Count of successfully processed requests.\n"
            "# TYPE vllm:request_success_total counter\n"
            f'vllm:request_success_total{{model_name="{self.models[0]}"}} {stats.completed}\n'
        )
        # Not vLLM's: the most requests it ever ran at once (make bench's capacity check reads it).
        text += f"# TYPE simulator_peak_running gauge\nsimulator_peak_running {stats.peak_running}\n"
        if self.cache is not None:
            label = f'{{model_name="{self.models[0]}"}}'
            text += (
                "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.\n"
                "# TYPE vllm:gpu_cache_usage_perc gauge\n"
                f"vllm:gpu_cache_usage_perc{label} {self.cache.usage():.4f}\n"
                "# TYPE vllm:prefix_cache_queries counter\n"
                f"vllm:prefix_cache_queries_total{label} {self.cache.queried_tokens}\n"
                "# TYPE vllm:prefix_cache_hits counter\n"
                f"vllm:prefix_cache_hits_total{label} {self.cache.hit_tokens}\n"
            )
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    def _denied(self, request: web.Request) -> web.Response | None:
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return _error(401, "invalid api key")
        return None

    async def list_models(self, request: web.Request) -> web.Response:
        denied = self._denied(request)
        if denied is not None:
            return denied
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "simulator"} for m in self.models]
        return _json(200, {"object": "list", "data": data})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=True)

    async def _accepted(self, request: web.Request) -> dict[str, Any] | web.Response:
        """The request's JSON object, recorded in the stats; or the refusal to answer with."""
        denied = self._denied(request)
        if denied is not None:
            return denied
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _error(400, "body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "body must be an object")
        self.stats.requests.append(
            {
                "path": request.path,
                "authorization": request.headers.get("Authorization", ""),
                "traceparent": request.headers.get("traceparent", ""),
                "body": body,
            }
        )
        return body

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=False)

    async def embeddings(self, request: web.Request) -> web.Response:
        """Deterministic vectors (from each input's hash) and usage: whitespace-separated words."""
        body = await self._accepted(request)
        if isinstance(body, web.Response):
            return body
        value = body.get("input")
        texts = [value] if isinstance(value, str) else value
        if isinstance(texts, list) and texts and isinstance(texts[0], int | list):
            # Token ids, as vLLM takes them: one token each, the ids' text for the vector.
            batch = texts if isinstance(texts[0], list) else [texts]
            texts = [" ".join(str(t) for t in ids) for ids in batch]
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            return _error(400, "input must be a string, an array of strings or token ids")
        how = _behaviour(self.behaviour, texts)
        if how.latency_ms:
            await asyncio.sleep(how.latency_ms / 1000)
        if how.status != 200:
            # The worker's host in its message, as real servers sometimes do: the gateway must scrub it.
            return _error(how.status, f"simulated failure {how.status} at {request.host}")
        vectors = [_vector(text, int(body.get("dimensions") or EMBEDDING_SIZE)) for text in texts]
        encode = body.get("encoding_format") == "base64"
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() if encode else v,
            }
            for i, v in enumerate(vectors)
        ]
        tokens = sum(len(t.split()) for t in texts)
        answer: dict[str, Any] = {"object": "list", "data": data, "model": str(body.get("model", ""))}
        if not how.omit_usage:
            answer["usage"] = {"prompt_tokens": tokens, "total_tokens": tokens}
        return _json(200, answer)

    async def rerank(self, request: web.Request) -> web.Response:
        """vLLM's /rerank: each document's share of the query's words, best first."""
        body = await self._accepted(request)
        if isinstance(body, web.Response):
            return body
        query, documents = str(body.get("query", "")), [str(d) for d in body.get("documents") or []]
        how = _behaviour(self.behaviour, [query, *documents])
        if how.status != 200:
            return _error(how.status, f"simulated failure {how.status}")
        words = set(query.lower().split())
        scores = [len(words & set(d.lower().split())) / (len(words) or 1) for d in documents]
        ranked = sorted(range(len(documents)), key=lambda i: (-scores[i], i))[: body.get("top_n") or len(documents)]
        tokens = sum(len(t.split()) for t in [query, *documents])
        answer: dict[str, Any] = {
            "id": "rerank-" + uuid.uuid4().hex[:24],
            "model": str(body.get("model", "")),
            "results": [{"index": i, "document": {"text": documents[i]}, "relevance_score": scores[i]} for i in ranked],
        }
        if not how.omit_usage:
            answer["usage"] = {"prompt_tokens": tokens, "total_tokens": tokens}
        return _json(200, answer)

    async def _complete(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        if not self.max_concurrency:
            return await self._answer(request, chat=chat)
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_concurrency)
        self.stats.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.stats.waiting -= 1
        try:
            return await self._answer(request, chat=chat)
        finally:
            self._slots.release()

    async def _answer(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        self.stats.running += 1
        self.stats.peak_running = max(self.stats.peak_running, self.stats.running)
        try:
            return await self._answer_running(request, chat=chat)
        finally:
            self.stats.running -= 1

    async def _answer_running(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        body = await self._accepted(request)
        if isinstance(body, web.Response):
            return body
        texts = _texts(body)
        how = _behaviour(self.behaviour, texts)
        if how.hang:
            await asyncio.sleep(3600)
        if how.latency_ms:
            await asyncio.sleep(how.latency_ms / 1000)
        if how.status != 200:
            return _error(how.status, f"simulated failure {how.status}")
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        count = max(0, min(how.deltas, int(limit))) if limit else how.deltas
        cached_tokens: int | None = None
        if self.cache is not None and self.gpu is not None:
            cached, blocks = self.cache.admit("\x1e".join(texts))
            self.stats.cached_blocks += cached
            self.stats.prompt_blocks += blocks
            cached_tokens = cached * TOKENS_PER_BLOCK
            work_ms = (blocks - cached) * self.gpu.prefill_ms_per_block + count * self.gpu.decode_ms_per_token
            await asyncio.sleep(work_ms / 1000)
        self.stats.completed += 1
        pieces = [_WORDS[i % len(_WORDS)] for i in range(count)]
        usage: dict[str, Any] = {
            "prompt_tokens": sum(len(t.split()) for t in texts),
            "completion_tokens": count,
            "total_tokens": sum(len(t.split()) for t in texts) + count,
        }
        if cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
        if how.usage is not None:
            usage = {"prompt_tokens": how.usage[0], "completion_tokens": how.usage[1]}
            if all(type(n) is int for n in how.usage):
                usage["total_tokens"] = how.usage[0] + how.usage[1]
        finish = "length" if limit and count >= int(limit) else "stop"
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        model = str(body.get("model", ""))
        tool = _tool_called(body) if chat else None
        if tool is not None:
            finish = "tool_calls"
        if body.get("stream"):
            return await self._stream(request, body, how, chat, ident, model, pieces, usage, finish, tool)
        if chat:
            message: dict[str, Any] = {"role": "assistant", "content": "".join(pieces)}
            if tool is not None:
                arguments = orjson.dumps({"text": "".join(pieces)}).decode()
                call = {
                    "id": "call_" + ident[9:],
                    "type": "function",
                    "function": {"name": tool, "arguments": arguments},
                }
                message = {"role": "assistant", "content": None, "tool_calls": [call]}
            answer: dict[str, Any] = {
                "id": ident,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "logprobs": None,
                        "finish_reason": finish,
                    }
                ],
            }
        else:
            answer = {
                "id": ident,
                "object": "text_completion",
                "created": int(time.time()),
                "model": model,
                "choices": [{"index": 0, "text": "".join(pieces), "logprobs": None, "finish_reason": finish}],
            }
        if not how.omit_usage:
            answer["usage"] = usage
        return _json(200, answer)

    async def _stream(
        self,
        request: web.Request,
        body: dict[str, Any],
        how: Behaviour,
        chat: bool,
        ident: str,
        model: str,
        pieces: list[str],
        usage: dict[str, Any],
        finish: str,
        tool: str | None = None,
    ) -> web.StreamResponse:
        options = body.get("stream_options") or {}
        include_usage = bool(options.get("include_usage")) and not how.omit_usage
        created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choice: dict[str, Any] | None, *, with_usage: bool = False) -> bytes:
            data: dict[str, Any] = {"id": ident, "object": kind, "created": created, "model": model}
            data["choices"] = [choice] if choice is not None else []
            if include_usage:
                data["usage"] = usage if with_usage else None
            return b"data: " + orjson.dumps(data) + b"\n\n"

        def piece(text: str, finish_reason: str | None = None, *, role: bool = False) -> dict[str, Any]:
            if not chat:
                return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            delta: dict[str, Any] = {"role": "assistant", "content": text} if role else {}
            if text and not role:
                delta["content"] = text
            if tool is not None and text:
                # A call's arguments stream in pieces: the JSON's opening, each word (escaped), its end.
                delta = {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        try:
            while how.comments_only:
                await response.write(b": keep-alive\n\n")
                await asyncio.sleep(0.2)
            if chat:
                await response.write(chunk(piece("", role=True)))
            if tool is not None:
                opening = {"index": 0, "id": "call_" + ident[9:], "type": "function"}
                opening["function"] = {"name": tool, "arguments": '{"text": "'}
                first = {"index": 0, "delta": {"tool_calls": [opening]}, "logprobs": None, "finish_reason": None}
                await response.write(chunk(first))
                pieces = [orjson.dumps(p).decode()[1:-1] for p in pieces] + ['"}']
            for i, text in enumerate(pieces):
                if how.cut_after is not None and i >= how.cut_after:
                    assert request.transport is not None
                    request.transport.abort()
                    return response
                if how.delay_ms:
                    await asyncio.sleep(how.delay_ms / 1000)
                await response.write(chunk(piece(text)))
            await response.write(chunk(piece("", finish)))
            if include_usage:
                await response.write(chunk(None, with_usage=True))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            self.stats.streams_abandoned += 1
            raise
        self.stats.streams_finished += 1
        return response


EMBEDDING_SIZE = 8


def _tool_called(body: dict[str, Any]) -> str | None:
    """The function a chat request makes the simulator call: tool_choice "required" (the first tool) or
    a named function; None otherwise (the simulator answers in text)."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        return str((choice.get("function") or {}).get("name") or "") or None
    if choice == "required":
        first = tools[0] if isinstance(tools[0], dict) else {}
        return str((first.get("function") or {}).get("name") or "") or None
    return None


def _vector(text: str, size: int) -> list[float]:
    """A unit vector that depends only on the text (float32-exact, so base64 round-trips equal)."""
    digest = hashlib.sha256(text.encode()).digest()
    raw = [digest[i % len(digest)] / 255 - 0.5 for i in range(size)]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [struct.unpack("<f", struct.pack("<f", x / norm))[0] for x in raw]


def _json(status: int, data: dict[str, Any]) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data), content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return _json(status, {"error": {"message": message, "type": "server_error", "code": None, "param": None}})


class AppThread:
    """Serves an aiohttp application on 127.0.0.1 and a free port from a daemon thread of its own (tests and
    demos in-process). Handlers are cancelled when their client disconnects, as vLLM aborts such a request."""

    def __init__(self, make_app: Callable[[], web.Application], *, name: str) -> None:
        self._make_app = make_app
        self._name = name
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> Self:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"the {self._name} did not start")
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._runner = web.AppRunner(self._make_app(), handler_cancellation=True, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.SockSite(self._runner, sock).start())
        self._ready.set()
        self._loop.run_forever()

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


class SimulatorThread(AppThread):
    """Runs a Simulator in-process (AppThread)."""

    def __init__(self, simulator: Simulator | None = None) -> None:
        self.simulator = simulator or Simulator()
        super().__init__(self.simulator.app, name="worker simulator")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m devtools.simulator", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument(
        "--model",
        action="append",
        help="a model id to list (repeatable; default acme/model-1 and acme/embed-1)",
    )
    parser.add_argument("--latency-ms", type=float, default=0.0, help="wait before each answer")
    parser.add_argument("--deltas", type=int, default=16, help="completion tokens per answer (capped by max_tokens)")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="wait between stream chunks")
    parser.add_argument("--api-key", default="", help="require this bearer key")
    parser.add_argument(
        "--max-concurrency", type=int, default=0, help="requests served at once; the rest queue (0: unbounded)"
    )
    parser.add_argument("--kv-blocks", type=int, default=0, help="GPU model: prefix KV-cache blocks (0: off)")
    parser.add_argument("--prefill-ms", type=float, default=2.0, help="GPU model: ms per uncached 64-char block")
    parser.add_argument("--decode-ms", type=float, default=1.0, help="GPU model: ms per completion token")
    args = parser.parse_args(argv)
    gpu = GpuModel(args.kv_blocks, args.prefill_ms, args.decode_ms) if args.kv_blocks > 0 else None
    simulator = Simulator(
        models=tuple(args.model or ["acme/model-1", "acme/embed-1", "acme/rerank-1"]),
        behaviour=Behaviour(latency_ms=args.latency_ms, deltas=args.deltas, delay_ms=args.delay_ms),
        api_key=args.api_key,
        max_concurrency=args.max_concurrency,
        gpu=gpu,
    )
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        pass
    # A burst of thousands of connections (bench --streams) overflows the default listen backlog of 128.
    web.run_app(
        simulator.app(),
        host=args.host,
        port=args.port,
        access_log=None,
        print=None,
        handler_cancellation=True,
        backlog=4096,
    )


if __name__ == "__main__":
    main()
