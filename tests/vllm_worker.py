"""A small vLLM-like worker for the money tests: a real HTTP server (aiohttp) in a daemon thread.

It answers GET /v1/models and POST /v1/chat/completions, plain and streaming, as vLLM's OpenAI server
does for a reasoning model: streamed deltas carry `reasoning_content` (or `reasoning`, vLLM's newer
name) before the `content` deltas, and the usage has `completion_tokens_details.reasoning_tokens`.
What a request gets is set by a directive in its message text, e.g. "[vllm reasoning=150 content=2
delay=20 latency=2500 status=500 field=reasoning]":

- reasoning=N  reasoning deltas to stream (default 0), one token each
- content=N    content deltas (default 4), one token each
- field=NAME   the reasoning delta's field: reasoning_content (default) or reasoning
- delay=MS     wait between stream chunks
- latency=MS   wait before answering (a slow answer)
- status=CODE  answer with that HTTP status and an OpenAI error body

`slow_next` / `slow_ms` make the next requests slow whatever they ask (an SDK's first attempt times out,
its retry is answered). `stats` records every request, and each one whose client went away before its answer ended
(`cancelled`: the handler is cancelled when its connection closes, as vLLM aborts the request).
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from devtools.simulator import AppThread

_DIRECTIVE = re.compile(r"\[vllm([^\]]*)\]")


@dataclass
class VllmStats:
    requests: int = 0
    cancelled: int = 0
    finished: int = 0
    statuses: list[int] = field(default_factory=list)


def _directives(body: dict[str, Any]) -> dict[str, str]:
    found: dict[str, str] = {}
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            for match in _DIRECTIVE.finditer(content):
                for item in match.group(1).split():
                    name, _, value = item.partition("=")
                    found[name] = value
    return found


def _prompt_tokens(body: dict[str, Any]) -> int:
    words = 0
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            words += len(content.split())
    return max(1, words)


class VllmWorker(AppThread):
    def __init__(self, *, models: tuple[str, ...] = ("acme/model-1",)) -> None:
        super().__init__(self.app, name="vLLM-like worker")
        self.models = models
        self.stats = VllmStats()
        self.slow_next = 0  # this many next requests wait slow_ms before answering, whatever they ask
        self.slow_ms = 0.0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": m, "object": "model"} for m in self.models]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.stats.requests += 1
        knobs = _directives(body)
        try:
            latency = float(knobs.get("latency", 0))
            if self.slow_next > 0:
                self.slow_next -= 1
                latency = self.slow_ms
            await asyncio.sleep(latency / 1000)
            status = int(knobs.get("status", 200))
            self.stats.statuses.append(status)
            if status != 200:
                error = {"error": {"message": f"simulated failure {status}", "type": "server_error", "code": status}}
                return web.json_response(error, status=status)
            if body.get("stream"):
                return await self._stream(request, body, knobs)
            reasoning, content = int(knobs.get("reasoning", 0)), int(knobs.get("content", 4))
            answer = {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "ok " * content, "reasoning_content": None},
                        "finish_reason": "stop",
                    }
                ],
                "usage": self._usage(body, reasoning, content),
            }
            self.stats.finished += 1
            return web.json_response(answer)
        except (ConnectionResetError, asyncio.CancelledError):  # the client closed its connection
            self.stats.cancelled += 1
            raise

    def _usage(self, body: dict[str, Any], reasoning: int, content: int) -> dict[str, Any]:
        prompt = _prompt_tokens(body)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": reasoning + content,
            "total_tokens": prompt + reasoning + content,
            "completion_tokens_details": {"reasoning_tokens": reasoning},
        }

    async def _stream(self, request: web.Request, body: dict[str, Any], knobs: dict[str, str]) -> web.StreamResponse:
        reasoning, content = int(knobs.get("reasoning", 0)), int(knobs.get("content", 4))
        reasoning_field = knobs.get("field", "reasoning_content")
        delay = float(knobs.get("delay", 0)) / 1000
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        base = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk", "model": body.get("model")}

        async def send(choices: list[dict[str, Any]], **extra: Any) -> None:
            await response.write(b"data: " + orjson.dumps({**base, "choices": choices, **extra}) + b"\n\n")

        await send([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        for i in range(reasoning):
            await asyncio.sleep(delay)
            await send([{"index": 0, "delta": {reasoning_field: f"think{i} "}, "finish_reason": None}])
        for i in range(content):
            await asyncio.sleep(delay)
            await send([{"index": 0, "delta": {"content": f"word{i} "}, "finish_reason": None}])
        await send([{"index": 0, "delta": {}, "finish_reason": "stop"}])
        if (body.get("stream_options") or {}).get("include_usage"):
            await send([], usage=self._usage(body, reasoning, content))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        self.stats.finished += 1
        return response
