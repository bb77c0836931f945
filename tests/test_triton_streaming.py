"""Streaming from Triton's generate extension, against the real Triton server and its decoupled models
(tests/triton_stream_model.py: one word per response, `token_delay_ms` apart)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import orjson
import pytest
from django.core.exceptions import ValidationError

from billing.models import Reservation, UsageRecord
from tests.factories import money
from tests.servers import stream_events
from workers.models import Worker
from workers.registration import registration_validate

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_gateway"), pytest.mark.triton]
# TensorRT-LLM's ensemble names (its count outputs since 2025), which the test models use too.
NAMES: dict[str, Any] = {
    "input_name": "text_input",
    "max_tokens_input_name": "max_tokens",
    "output_name": "text_output",
    "prompt_tokens_output_name": "num_input_tokens",
    "completion_tokens_output_name": "num_output_tokens",
    "streaming": "generate_stream",
}
WORDS = "one two three four five six seven eight"


@pytest.fixture
def world(make_world):
    triton = {
        "acme/tri-stream": "text_stream",
        "acme/tri-stream-uncounted": "text_stream_no_counts",
        "acme/tri-stream-failing": "text_stream_failing",
    }
    return make_world(account="triton-streamer", worker=None, triton=triton, triton_config=NAMES)


def raw_events(world, model: str, prompt: str, **body: Any) -> list[tuple[float, bytes]]:
    """(seconds since the request, data payload) of every event, read with a plain HTTP client."""
    payload = {"model": model, "prompt": prompt, "stream": True, **body}
    return stream_events(world["url"], "/v1/completions", world["secret"], payload)


def test_sdk_chat_stream_arrives_token_by_token_and_settles_on_tritons_counts(world):
    stream = world["ai"].chat.completions.create(
        model="acme/tri-stream",
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": WORDS}],
    )
    arrivals, chunks = [], []
    for chunk in stream:
        chunks.append(chunk)
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.perf_counter())
    # The default template renders "user: one two ...\nassistant:"; the model echoes words, one per event.
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "user: one two three four five"
    assert len(arrivals) == 6
    assert arrivals[-1] - arrivals[0] >= 5 * 0.1 * 0.8  # 100 ms between tokens on Triton: relayed as they came
    assert all(c.model == "acme/tri-stream" and c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (10, 6)
    record = UsageRecord.objects.get()
    assert (record.prompt_tokens, record.completion_tokens, record.streamed, record.status) == (10, 6, True, "ok")
    assert record.worker_id == "triton-text_stream" and record.ttft_ms is not None
    assert money(world["account"]) == (10_000_000 - record.cost, 0)


def test_usage_chunk_comes_before_done_only_when_asked(world):
    events = [
        e for _, e in raw_events(world, "acme/tri-stream", "alpha beta gamma", stream_options={"include_usage": True})
    ]
    assert events[-1] == b"[DONE]"
    assert orjson.loads(events[-2])["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    chunks = [orjson.loads(e) for e in events[:-2]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "alpha beta gamma"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"

    quiet = [e for _, e in raw_events(world, "acme/tri-stream", "alpha beta")]
    assert quiet[-1] == b"[DONE]"
    assert all("usage" not in orjson.loads(e) for e in quiet[:-1])
    assert [r.completion_tokens for r in UsageRecord.objects.order_by("pk")] == [3, 2]  # charged all the same


def test_a_stream_without_counts_ends_in_an_error_event_and_charges_nothing(world):
    before = money(world["account"])
    events = [e for _, e in raw_events(world, "acme/tri-stream-uncounted", "alpha beta gamma")]
    assert b"[DONE]" not in events
    texts = [orjson.loads(e)["choices"][0]["text"] for e in events[:-1]]
    assert texts == ["alpha", " beta", " gamma"]  # the text was relayed as it came
    assert orjson.loads(events[-1])["error"]["code"] == "runtime_usage_unavailable"
    assert money(world["account"]) == before
    assert Reservation.objects.get().status == "released"
    record = UsageRecord.objects.get()
    assert (record.status, record.error_code, record.cost) == ("failed", "runtime_usage_unavailable", 0)


def test_a_model_failing_mid_stream_ends_in_an_error_event_and_charges_nothing(world):
    before = money(world["account"])
    events = [e for _, e in raw_events(world, "acme/tri-stream-failing", WORDS)]
    assert b"[DONE]" not in events
    assert [orjson.loads(e)["choices"][0]["text"] for e in events[:-1]] == ["one", " two"]
    error = orjson.loads(events[-1])["error"]
    assert error["code"] == "triton_inference_failed"
    assert "failed on purpose" not in error["message"]  # Triton's words stay in the logs
    assert money(world["account"]) == before
    assert Reservation.objects.get().status == "released"
    assert Worker.objects.get(worker_id="triton-text_stream_failing").consecutive_failures == 1


def test_a_non_streaming_request_joins_the_events_text_and_settles(world):
    reply = world["ai"].completions.create(model="acme/tri-stream", prompt="alpha beta gamma delta", max_tokens=3)
    assert reply.choices[0].text == "alpha beta gamma"
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (4, 3)
    record = UsageRecord.objects.get()
    assert (record.prompt_tokens, record.completion_tokens, record.streamed) == (4, 3, False)
    assert money(world["account"]) == (10_000_000 - record.cost, 0)

    with pytest.raises(openai.APIStatusError) as info:
        world["ai"].completions.create(model="acme/tri-stream-uncounted", prompt="alpha")
    assert (info.value.status_code, info.value.body["code"]) == (502, "runtime_usage_unavailable")  # type: ignore[index]


def _wait_closed(timeout: float = 5.0) -> Reservation:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reservation = Reservation.objects.first()
        if reservation is not None and reservation.status != "held":
            return reservation
        time.sleep(0.05)
    raise AssertionError("the reservation stayed held after the client left")


def test_a_client_leaving_mid_stream_cancels_the_request_on_triton_and_pays_for_what_it_was_sent(world):
    before = money(world["account"])
    prompt = " ".join(f"w{i}" for i in range(30))
    seen = 0
    with httpx.stream(
        "POST",
        world["url"] + "/v1/completions",
        json={"model": "acme/tri-stream", "prompt": prompt, "max_tokens": 30, "stream": True},
        headers={"Authorization": f"Bearer {world['secret']}"},
        timeout=10,
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and orjson.loads(line[6:])["choices"][0]["text"]:
                seen += 1
                if seen == 2:
                    break
    assert _wait_closed().status == "settled"
    record = UsageRecord.objects.get()
    assert record.status == "client_disconnected"
    assert 2 <= record.completion_tokens <= 4  # what was sent before the gateway noticed, not the 30 asked for
    assert money(world["account"]) == (before[0] - record.cost, 0)
    deadline = time.monotonic() + 5
    while "stream cancelled after" not in world["triton"].tail(20) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "stream cancelled after" in world["triton"].tail(20)  # Triton saw the request cancelled and stopped


def _registration(**config: Any) -> dict[str, Any]:
    return {
        "worker_id": "trtllm-1",
        "worker_type": "nvidia-gpu",
        "runtime": "triton",
        "runtime_endpoint": "http://10.0.0.5:8000",
        "supported_models": ["acme/tri-stream"],
        "runtime_config": {"model_name": "ensemble", **NAMES, **config},
    }


def test_registration_accepts_only_generate_stream(world):
    spec = registration_validate(_registration(generate_inputs={"return_num_input_tokens": True}))
    assert spec.runtime_config["streaming"] == "generate_stream"
    for config, field in (
        ({"streaming": "yes"}, "runtime_config.streaming"),
        ({"generate_inputs": {"stream": False}}, "runtime_config.generate_inputs.stream"),
        ({"generate_inputs": {"text_input": "x"}}, "runtime_config.generate_inputs.text_input"),
        ({"generate_inputs": {"bad_words": ["a"]}}, "runtime_config.generate_inputs.bad_words"),
    ):
        with pytest.raises(ValidationError) as info:
            registration_validate(_registration(**config))
        assert field in info.value.message_dict
