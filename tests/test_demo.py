"""`make run`'s demo, end to end: seeddemo then rundemo on the embedded default, as a newcomer runs it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from devtools.tritonserver import triton_installed

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_embedded_demo_serves_chat_streaming_and_triton(tmp_path):
    gateway, simulator, triton = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DEBUG", "SECRET_KEY")}
    env.update(
        SPEEDINFER_VAR_DIR=str(tmp_path),
        SPEEDINFER_SIMULATOR_PORT=str(simulator),
        SPEEDINFER_DEMO_TRITON_PORT=str(triton),
        SPEEDINFER_PROBE_INTERVAL="1",
        PYTHONUNBUFFERED="1",
    )

    def manage(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    manage("migrate", "--noinput", "-v", "0")
    key = manage("seeddemo").strip().splitlines()[-1]
    assert key.startswith("sk-si-")
    assert manage("seeddemo").strip().splitlines()[-1] == key  # idempotent: the same demo key again
    log = (tmp_path / "rundemo.log").open("wb")
    demo = subprocess.Popen(
        [sys.executable, "manage.py", "rundemo", "--port", str(gateway)], cwd=ROOT, env=env, stdout=log, stderr=log
    )
    base = f"http://127.0.0.1:{gateway}"
    try:
        expected = 3 if triton_installed() else 1
        deadline = time.monotonic() + 90
        health: dict = {}
        while time.monotonic() < deadline:
            try:
                health = httpx.get(f"{base}/health", timeout=2).json()
                if health["status"] == "ok" and len(health["workers"]) == expected:
                    break
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
        assert health.get("status") == "ok", (tmp_path / "rundemo.log").read_text()[-3000:]

        headers = {"Authorization": f"Bearer {key}"}
        chat = {"model": "acme/model-1", "messages": [{"role": "user", "content": "Explain the request path"}]}
        reply = httpx.post(f"{base}/v1/chat/completions", json=chat, headers=headers, timeout=30)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] > 0
        with httpx.stream(
            "POST", f"{base}/v1/chat/completions", json={**chat, "stream": True}, headers=headers, timeout=30
        ) as stream:
            events = [line for line in stream.iter_lines() if line.startswith("data:")]
        assert events[-1] == "data: [DONE]"
        embedding = {"model": "acme/embed-1", "input": ["Explain", "the request path"]}
        vectors = httpx.post(f"{base}/v1/embeddings", json=embedding, headers=headers, timeout=30)
        assert vectors.status_code == 200 and vectors.json()["usage"]["prompt_tokens"] == 4
        # The README's quick start: the Responses API through the openai SDK, translated to chat.
        ai = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
        response = ai.responses.create(model="acme/model-1", input="Explain the request path")
        assert response.output_text and response.usage is not None and response.usage.output_tokens > 0
        ranked = httpx.post(
            f"{base}/v1/rerank",
            json={"model": "acme/rerank-1", "query": "request path", "documents": ["a cat", "the request path"]},
            headers=headers,
            timeout=30,
        )
        assert ranked.status_code == 200 and ranked.json()["results"][0]["index"] == 1
        # A model's kind decides its endpoints: the embedding model answers no chat.
        wrong = httpx.post(f"{base}/v1/chat/completions", json={**chat, "model": "acme/embed-1"}, headers=headers)
        assert wrong.status_code == 400 and "/v1/chat/completions" in wrong.json()["error"]["message"]
        if expected == 3:
            triton_chat = {**chat, "model": "acme/triton-demo"}
            reply = httpx.post(f"{base}/v1/chat/completions", json=triton_chat, headers=headers, timeout=30)
            assert reply.status_code == 200, reply.text
            assert reply.json()["usage"]["prompt_tokens"] > 0
            refused = httpx.post(
                f"{base}/v1/chat/completions", json={**triton_chat, "stream": True}, headers=headers, timeout=30
            )
            assert refused.status_code == 400 and refused.json()["error"]["code"] == "streaming_unsupported"
            streamed = {**chat, "model": "acme/triton-stream-demo", "stream": True}
            with httpx.stream(
                "POST", f"{base}/v1/chat/completions", json=streamed, headers=headers, timeout=30
            ) as stream:
                events = [line for line in stream.iter_lines() if line.startswith("data:")]
            assert events[-1] == "data: [DONE]" and len(events) > 3  # one chunk per word from the decoupled model
    finally:
        demo.send_signal(signal.SIGTERM)
        demo.wait(timeout=60)
        log.close()
    # Ctrl-C / SIGTERM stops the whole demo: nothing is left on its ports.
    for port in (gateway, simulator, triton):
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", port)) != 0
