"""The direct Triton transport through the gateway, against the real Triton server (tests/triton_server.py)."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from billing.models import Reservation, UsageRecord
from tests.factories import make_account, make_key, make_model, money
from tests.servers import register_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_gateway"), pytest.mark.triton]
NAMES: dict[str, Any] = {
    "input_name": "text_input",
    "max_tokens_input_name": "max_tokens",
    "output_name": "text_output",
    "prompt_tokens_output_name": "prompt_tokens",
    "completion_tokens_output_name": "completion_tokens",
}


@pytest.fixture
def world(make_world):
    triton = {"acme/tri": "text_generation", "acme/tri-failing": "text_failing", "acme/tri-uncounted": "text_no_counts"}
    return make_world(account="triton-customer", worker=None, triton=triton, triton_config=NAMES)


def test_chat_is_answered_from_triton_with_its_own_counts(world):
    reply = world["ai"].chat.completions.create(
        model="acme/tri", max_tokens=3, messages=[{"role": "user", "content": "one two three four five"}]
    )
    assert reply.object == "chat.completion"
    assert reply.model == "acme/tri"
    # The default template renders "user: one two three four five\nassistant:"; the test model echoes words.
    assert reply.choices[0].message.content == "user: one two"
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (7, 3)
    record = UsageRecord.objects.get()
    assert (record.prompt_tokens, record.completion_tokens, record.worker_id) == (7, 3, "triton-text_generation")
    assert money(world["account"]) == (10_000_000 - record.cost, 0)


def test_completions_from_triton(world):
    reply = world["ai"].completions.create(model="acme/tri", prompt="alpha beta", max_tokens=8)
    assert reply.object == "text_completion"
    assert reply.choices[0].text == "alpha beta"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None and reply.usage.total_tokens == 4


def test_502_triton_inference_failed(world):
    before = money(world["account"])
    with pytest.raises(openai.APIStatusError) as info:
        world["ai"].completions.create(model="acme/tri-failing", prompt="please FAIL_ON_DEMAND")
    assert info.value.status_code == 502
    assert info.value.body["code"] == "triton_inference_failed"  # type: ignore[index]
    assert "failed on purpose" not in str(info.value.body)  # Triton's words stay in the logs
    assert money(world["account"]) == before
    assert Reservation.objects.get().status == "released"


def test_502_runtime_usage_unavailable_without_count_tensors(world):
    before = money(world["account"])
    with pytest.raises(openai.APIStatusError) as info:
        world["ai"].completions.create(model="acme/tri-uncounted", prompt="hello")
    assert (info.value.status_code, info.value.body["code"]) == (502, "runtime_usage_unavailable")  # type: ignore[index]
    assert money(world["account"]) == before


def test_streaming_is_refused_before_anything_is_reserved(world):
    with pytest.raises(openai.APIStatusError) as info:
        world["ai"].chat.completions.create(model="acme/tri", stream=True, messages=[{"role": "user", "content": "hi"}])
    assert (info.value.status_code, info.value.body["code"]) == (400, "streaming_unsupported")  # type: ignore[index]
    assert not Reservation.objects.exists()


def test_a_stream_goes_only_to_the_workers_whose_capabilities_say_they_stream(gateway_server, triton_server, simulator):
    """One model on a direct Triton worker and an OpenAI-compatible one: both answer plain requests, but
    only the OpenAI one streams (runtimes.interface.Capabilities), so every stream request goes there."""
    from workers import routing
    from workers.models import Worker

    make_model(model_id="acme/model-1", max_output_tokens=32)
    register_worker(simulator.base_url, worker_id="sim-openai")
    register_worker(
        triton_server.url,
        worker_id="triton-direct",
        runtime="triton",
        models=("acme/model-1",),
        model_name="text_generation",
        **NAMES,
    )
    assert set(Worker.objects.filter(healthy=True).values_list("worker_id", flat=True)) == {
        "sim-openai",
        "triton-direct",
    }
    account = make_account(name="mixed-pool", credits=10)
    ai = openai.OpenAI(base_url=gateway_server.url + "/v1", api_key=make_key(account=account).secret, max_retries=0)
    hello: Any = [{"role": "user", "content": "hello"}]
    for _ in range(4):
        chunks = list(ai.chat.completions.create(model="acme/model-1", stream=True, messages=hello))
        assert any(c.choices and c.choices[0].delta.content for c in chunks)
    assert list(UsageRecord.objects.values_list("worker_id", "streamed")) == [("sim-openai", True)] * 4

    # Without the OpenAI worker the Triton one still answers, and a stream is refused as docs/interface.md says.
    Worker.objects.filter(worker_id="sim-openai").update(enabled=False)
    routing.invalidate()
    ai.chat.completions.create(model="acme/model-1", max_tokens=3, messages=hello)
    assert UsageRecord.objects.latest("id").worker_id == "triton-direct"
    with pytest.raises(openai.APIStatusError) as info:
        ai.chat.completions.create(model="acme/model-1", stream=True, messages=hello)
    assert (info.value.status_code, info.value.body["code"]) == (400, "streaming_unsupported")  # type: ignore[index]
    assert money(account) == (10_000_000 - sum(UsageRecord.objects.values_list("cost", flat=True)), 0)


def test_features_a_direct_triton_worker_cannot_honour_are_refused_naming_the_field(world):
    """docs/interface.md, silent drops are refused: never a 200 that ignored the field; nothing held."""
    hello: Any = [{"role": "user", "content": "hi"}]
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("/v1/chat/completions", {"messages": hello, "tools": [tool]}, "tools"),
        ("/v1/chat/completions", {"messages": hello, "response_format": {"type": "json_object"}}, "response_format"),
        ("/v1/chat/completions", {"messages": hello, "n": 2}, "n"),
        ("/v1/chat/completions", {"messages": hello, "logprobs": True}, "logprobs"),
        ("/v1/completions", {"prompt": "hi", "best_of": 2}, "best_of"),
        ("/v1/completions", {"prompt": ["a", "b"]}, "prompt"),
        ("/v1/completions", {"prompt": [1, 2, 3]}, "prompt"),
    ]
    from catalog.models import PublicModel

    PublicModel.objects.filter(model_id="acme/tri").update(media_tokens=100)  # the model takes media...
    media: Any = {"messages": [{"role": "user", "content": [image]}]}
    cases.append(("/v1/chat/completions", media, "messages[0].content[0]"))
    from catalog import cache as catalog

    catalog.forget()
    for path, body, param in cases:
        response = httpx.post(
            world["url"] + path,
            json={"model": "acme/tri", **body},
            headers={"Authorization": f"Bearer {world['secret']}"},
            timeout=30,
        )
        assert response.status_code == 400, (body, response.text)
        error = response.json()["error"]
        assert (error["code"], error["param"]) == ("invalid_request", param), body
    # ... but its only worker, a direct Triton one, cannot be sent them (Capabilities.media).
    assert money(world["account"]) == (10_000_000, 0) and not Reservation.objects.exists()


def test_a_mixed_pool_sends_tools_only_to_the_workers_that_honour_them(gateway_server, triton_server, simulator):
    make_model(model_id="acme/model-1", max_output_tokens=32, media_tokens=50)
    register_worker(simulator.base_url, worker_id="sim-openai")
    register_worker(
        triton_server.url,
        worker_id="triton-direct",
        runtime="triton",
        models=("acme/model-1",),
        model_name="text_generation",
        **NAMES,
    )
    account = make_account(name="mixed-tools", credits=10)
    ai = openai.OpenAI(base_url=gateway_server.url + "/v1", api_key=make_key(account=account).secret, max_retries=0)
    hello: Any = [{"role": "user", "content": "hello"}]
    tool: Any = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    for _ in range(4):
        ai.chat.completions.create(model="acme/model-1", max_tokens=3, messages=hello, tools=[tool])
        ai.chat.completions.create(model="acme/model-1", max_tokens=3, messages=hello, n=2)
        picture: Any = [
            {"type": "text", "text": "what is it"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        ]
        ai.chat.completions.create(model="acme/model-1", max_tokens=3, messages=[{"role": "user", "content": picture}])
    assert set(UsageRecord.objects.values_list("worker_id", flat=True)) == {"sim-openai"}
    assert UsageRecord.objects.count() == 12
    ai.chat.completions.create(model="acme/model-1", max_tokens=3, messages=hello)  # plain text: either worker
    assert money(account) == (10_000_000 - sum(UsageRecord.objects.values_list("cost", flat=True)), 0)


def test_a_triton_worker_reports_cached_tokens_through_its_output_name(gateway_server, triton_server):
    # The test model has no cache; its prompt-count output stands in for one (every prompt token cached).
    make_model(model_id="acme/tri-cached", max_output_tokens=32, cached_input_price=0)
    register_worker(
        triton_server.url,
        worker_id="triton-cached",
        runtime="triton",
        models=("acme/tri-cached",),
        model_name="text_generation",
        cached_tokens_output_name="prompt_tokens",
        **NAMES,
    )
    account = make_account(name="triton-cached", credits=10)
    ai = openai.OpenAI(base_url=gateway_server.url + "/v1", api_key=make_key(account=account).secret, max_retries=0)
    ai.chat.completions.create(
        model="acme/tri-cached", max_tokens=3, messages=[{"role": "user", "content": "one two three four five"}]
    )
    record = UsageRecord.objects.get()
    assert (record.prompt_tokens, record.cached_tokens, record.completion_tokens) == (7, 7, 3)
    # (7 - 7) x 1 + 7 x 0 + 3 x 2 credits per 1M tokens: the cached prompt is free on this model.
    assert record.cost == 6
    assert money(account) == (10_000_000 - 6, 0)
