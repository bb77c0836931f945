"""The Triton adapter against the real Triton server (tests/triton_server.py, tests/triton_models)."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from runtimes.errors import RuntimeUsageUnavailable, TritonInferenceFailed, UpstreamError, UpstreamTimeout
from runtimes.target import WorkerTarget
from runtimes.triton import (
    TritonResult,
    render_chat_prompt,
    triton_infer,
    triton_model_ready,
    triton_repository_index,
    triton_server_ready,
)

pytestmark = pytest.mark.triton
NAMES = {
    "input_name": "text_input",
    "max_tokens_input_name": "max_tokens",
    "output_name": "text_output",
    "prompt_tokens_output_name": "prompt_tokens",
    "completion_tokens_output_name": "completion_tokens",
}


def view(endpoint: str, model_name: str = "text_generation", **config) -> WorkerTarget:
    return WorkerTarget(
        pk=1,
        worker_id="triton-test",
        runtime="triton",
        transport="triton",
        endpoint=endpoint,
        runtime_config={**NAMES, "model_name": model_name, **config},
    )


def infer(worker: WorkerTarget, prompt: str, max_tokens: int = 16) -> TritonResult:
    return asyncio.run(triton_infer(worker=worker, prompt=prompt, max_tokens=max_tokens))


def check(coro):
    return asyncio.run(coro)


TIMEOUT = httpx.Timeout(5)


def test_server_and_model_readiness(triton_server):
    worker = view(triton_server.url)
    assert check(triton_server_ready(worker=worker, http_timeout=TIMEOUT)) == (True, "")
    assert check(triton_model_ready(worker=worker, model_name="text_generation", http_timeout=TIMEOUT)) == (True, "")
    ready, why = check(triton_model_ready(worker=worker, model_name="no_such_model", http_timeout=TIMEOUT))
    assert not ready
    assert "400" in why and "not ready" in why


def test_repository_index_lists_the_ready_models(triton_server):
    names = check(triton_repository_index(worker=view(triton_server.url), http_timeout=TIMEOUT))
    assert names == [
        "text_embedding",
        "text_failing",
        "text_generation",
        "text_no_counts",
        "text_stream",
        "text_stream_failing",
        "text_stream_no_counts",
        "text_trtllm_names",
    ]


def test_infer_returns_text_and_the_models_own_counts(triton_server):
    result = infer(view(triton_server.url), "the quick brown fox jumps", max_tokens=3)
    assert result == TritonResult(text="the quick brown", prompt_tokens=5, completion_tokens=3)


def test_infer_with_other_tensor_names(triton_server):
    worker = view(
        triton_server.url,
        "text_trtllm_names",
        prompt_tokens_output_name="num_input_tokens",
        completion_tokens_output_name="num_output_tokens",
    )
    assert infer(worker, "one two three", max_tokens=8) == TritonResult("one two three", 3, 3)


def test_missing_counts_are_runtime_usage_unavailable(triton_server):
    with pytest.raises(RuntimeUsageUnavailable) as info:
        infer(view(triton_server.url, "text_no_counts"), "hello there")
    assert info.value.code == "runtime_usage_unavailable"
    assert info.value.counts_against_circuit is False


def test_a_failing_model_is_triton_inference_failed_with_tritons_message(triton_server):
    worker = view(triton_server.url, "text_failing")
    assert infer(worker, "works fine").completion_tokens == 2
    with pytest.raises(TritonInferenceFailed) as info:
        infer(worker, "please FAIL_ON_DEMAND now")
    assert info.value.code == "triton_inference_failed"
    assert "failed on purpose" in info.value.detail
    assert "failed on purpose" not in info.value.message  # the client sees ours, the logs Triton's
    assert info.value.counts_against_circuit is True  # a 500 from the model


def test_a_rejected_request_does_not_count_against_the_circuit(triton_server):
    with pytest.raises(TritonInferenceFailed) as info:
        infer(view(triton_server.url, "text_generation", input_name="wrong_input"), "hi")
    assert info.value.detail.startswith("400")
    assert info.value.counts_against_circuit is False
    with pytest.raises(TritonInferenceFailed) as info:
        infer(view(triton_server.url, "no_such_model"), "hi")
    assert info.value.counts_against_circuit is False


def test_unreachable_and_silent_workers():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(UpstreamError):
        infer(view(f"http://127.0.0.1:{port}"), "hi")
    # A socket that accepts connections (backlog) but never answers.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(UpstreamTimeout):
            infer(view(endpoint, read_timeout=0.3), "hi")


def test_render_chat_prompt_default_and_configured_template():
    messages: list[dict] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi {content}"}]},
    ]
    assert render_chat_prompt(messages, {}) == "system: be brief\nuser: hi {content}\nassistant:"
    template = {"prefix": "<s>", "message": "[{role}] {content}|", "suffix": "[assistant]"}
    assert (
        render_chat_prompt(messages, {"chat_template": template})
        == "<s>[system] be brief|[user] hi {content}|[assistant]"
    )
