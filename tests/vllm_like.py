"""A small vLLM-like worker (a real HTTP server) for the money tests: unlike devtools.simulator it bills
what a real runtime would read as prompt, from the whole body.

- prompt tokens: one per `bytes_per_token` UTF-8 bytes of every string in the body but `model` (so a
  pass-through field such as vLLM's `documents` is billed, as vLLM bills it), plus one per token id, plus
  `media_cost` per media content part; `prompt_tokens` overrides the count;
- n (times best_of's excess, times the prompts of a batch) choices of `completion_tokens` tokens each;
- a tool call when the request carries `tools`;
- usage with `prompt_tokens_details.cached_tokens` and `completion_tokens_details.reasoning_tokens`;
- every body it was sent, in `bodies`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from aiohttp import web

from devtools.simulator import Simulator, SimulatorThread

MEDIA = ("image_url", "input_audio", "video_url", "file")


class VLLMLike(Simulator):
    def __init__(self) -> None:
        super().__init__(models=("acme/model-1",))
        self.bytes_per_token = 1
        self.prompt_tokens: int | None = None
        self.completion_tokens = 5
        self.cached_tokens = 0
        self.reasoning_tokens = 0
        self.media_cost = 100
        self.bodies: list[dict[str, Any]] = []

    def app(self) -> web.Application:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        return app

    def count_prompt(self, body: dict[str, Any]) -> int:
        strings = media = 0

        def walk(node: Any) -> None:
            nonlocal strings, media
            if isinstance(node, dict):
                if node.get("type") in MEDIA:
                    media += 1
                    return
                for name, value in node.items():
                    if name != "model":
                        walk(value)
            elif isinstance(node, list):
                for value in node:
                    walk(value)
            elif isinstance(node, str):
                strings += len(node.encode())

        prompt: Any = body.get("prompt")
        ids = 0
        if _is_ids(prompt):
            ids = sum(len(p) for p in prompt) if isinstance(prompt[0], list) else len(prompt)
            body = {k: v for k, v in body.items() if k != "prompt"}
        walk(body)
        return -(-strings // self.bytes_per_token) + ids + media * self.media_cost

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._vllm(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._vllm(request, chat=False)

    async def _vllm(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.bodies.append(body)
        n = int(body.get("n") or 1)
        prompt = body.get("prompt")
        batch = len(prompt) if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list) else 1
        choices_count = max(n, int(body.get("best_of") or 1)) * batch
        completion = self.completion_tokens * choices_count
        choices: list[dict[str, Any]] = []
        for i in range(n * batch):
            text = " ".join(["tok"] * self.completion_tokens)
            if chat:
                message: dict[str, Any] = {"role": "assistant", "content": text}
                if body.get("tools"):
                    message["content"] = None
                    message["tool_calls"] = [
                        {"id": f"call-{i}", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
                    ]
                choices.append({"index": i, "message": message, "finish_reason": "stop"})
            else:
                choices.append({"index": i, "text": text, "finish_reason": "stop"})
        prompt_tokens = self.count_prompt(body) if self.prompt_tokens is None else self.prompt_tokens
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
        }
        answer = {
            "id": "vllm-1",
            "object": "chat.completion" if chat else "text_completion",
            "created": 0,
            "model": body.get("model", ""),
            "choices": choices,
            "usage": usage,
        }
        return web.Response(body=orjson.dumps(answer), content_type="application/json")


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and isinstance(value[0], int | list)


@pytest.fixture
def vllm_worker() -> Iterator[tuple[VLLMLike, SimulatorThread]]:
    worker = VLLMLike()
    thread = SimulatorThread(worker).start()
    yield worker, thread
    thread.stop()
