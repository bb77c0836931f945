"""POST /v1/embeddings and GET /v1/models/{id} through the official openai SDK, against the simulator and the real
Triton server (a Python-backend embedding model in tests/triton_models/text_embedding)."""

from __future__ import annotations

import base64
import struct
from typing import Any

import httpx
import openai
import pytest

from accounts.models import Account
from billing.models import Reservation, UsageRecord
from core.credits import MICRO
from tests.factories import make_key, make_model
from tests.servers import register_worker
from workers.models import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_gateway")]
EMBED_NAMES: dict[str, Any] = {
    "model_name": "text_embedding",
    "input_name": "text_input",
    "output_name": "embedding",
    "prompt_tokens_output_name": "prompt_tokens",
}


@pytest.fixture
def world(make_world):
    # 3 credits per 1M input tokens: the charge of n prompt tokens is ceil(3n micro-credits).
    return make_world(account="embedder", model={"input_price": 3 * MICRO, "output_price": 5 * MICRO})


def available(world) -> int:
    return Account.objects.get(pk=world["account"].pk).available


def test_embeddings_float_and_base64_through_the_sdk_charged_at_the_input_price(world, simulator):
    ai: openai.OpenAI = world["ai"]
    floats = ai.embeddings.create(model="acme/model-1", input=["one two three", "four"], encoding_format="float")
    assert floats.model == "acme/model-1" and len(floats.data) == 2 and len(floats.data[0].embedding) == 8
    assert floats.usage.prompt_tokens == 4
    # The SDK's default asks for base64 and decodes it: the same vectors.
    decoded = ai.embeddings.create(model="acme/model-1", input=["one two three", "four"])
    assert simulator.simulator.stats.requests[-1]["body"]["encoding_format"] == "base64"
    assert [d.embedding for d in decoded.data] == [d.embedding for d in floats.data]
    records = list(UsageRecord.objects.order_by("id"))
    assert [(r.endpoint, r.prompt_tokens, r.completion_tokens, r.cost) for r in records] == [
        ("/v1/embeddings", 4, 0, 12),
        ("/v1/embeddings", 4, 0, 12),
    ]
    assert available(world) == 10 * MICRO - 24
    assert set(Reservation.objects.values_list("status", flat=True)) == {"settled"}
    usage = httpx.get(world["url"] + "/v1/usage", headers={"Authorization": f"Bearer {world['secret']}"}).json()
    assert [row["endpoint"] for row in usage["data"]] == ["/v1/embeddings", "/v1/embeddings"]


def test_token_id_inputs_count_one_prompt_token_each(world, simulator):
    ai: openai.OpenAI = world["ai"]
    answer = ai.embeddings.create(model="acme/model-1", input=[[101, 2023, 2003], [101, 7592]], encoding_format="float")
    assert len(answer.data) == 2 and answer.usage.prompt_tokens == 5
    record = UsageRecord.objects.get()
    assert record.cost == 15  # 5 tokens at 3 credits per 1M
    body = simulator.simulator.stats.requests[-1]["body"]
    assert body["input"] == [[101, 2023, 2003], [101, 7592]]  # forwarded as sent
    assert available(world) == 10 * MICRO - 15 and not Reservation.objects.filter(status="held").exists()


def test_embeddings_refusals(world, simulator):
    ai: openai.OpenAI = world["ai"]
    for bad in ([], [""], None, [1.5, 2], [[1, 2], "a"]):
        with pytest.raises(openai.BadRequestError) as info:
            ai.embeddings.create(model="acme/model-1", input=bad)  # type: ignore[arg-type]
        assert info.value.body["param"].startswith("input")  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        ai.embeddings.create(model="acme/model-1", input="hi", encoding_format="int8")  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        ai.embeddings.create(model="acme/nope", input="hi")
    # A key without the embeddings scope (keys made before it existed keep theirs).
    narrow = make_key(account=world["account"], scopes=["chat"]).secret
    with pytest.raises(openai.PermissionDeniedError) as denied:
        openai.OpenAI(base_url=world["url"] + "/v1", api_key=narrow, max_retries=0).embeddings.create(
            model="acme/model-1", input="hi"
        )
    assert denied.value.body["code"] == "insufficient_scope"  # type: ignore[index]
    # No usage from the worker: nothing charged.
    with pytest.raises(openai.APIStatusError) as unusable:
        ai.embeddings.create(model="acme/model-1", input="hi [sim no-usage]")
    assert unusable.value.body["code"] == "runtime_usage_unavailable"  # type: ignore[index]
    assert available(world) == 10 * MICRO


def test_models_retrieve_with_pricing_and_cap(world):
    ai: openai.OpenAI = world["ai"]
    model = ai.models.retrieve("acme/model-1")  # the SDK sends acme%2Fmodel-1
    assert model.id == "acme/model-1"
    extra: dict[str, Any] = model.model_extra or {}
    assert extra["pricing"] == {"input": "3.000000", "output": "5.000000", "cached_input": "3.000000"}
    assert extra["max_output_tokens"] == 64
    literal = httpx.get(
        world["url"] + "/v1/models/acme/model-1", headers={"Authorization": f"Bearer {world['secret']}"}
    )
    assert literal.status_code == 200 and literal.json()["id"] == "acme/model-1"
    listed = ai.models.list().data
    assert [(m.id, (m.model_extra or {})["pricing"]["input"]) for m in listed] == [("acme/model-1", "3.000000")]
    with pytest.raises(openai.NotFoundError) as info:
        ai.models.retrieve("acme/unknown")
    assert info.value.body["code"] == "model_not_found"  # type: ignore[index]


@pytest.mark.triton
def test_embeddings_from_a_triton_embedding_model(world, triton_server):
    make_model(model_id="acme/tri-embed", input_price=2 * MICRO, output_price=0)
    register_worker(
        triton_server.url,
        worker_id="triton-embed",
        runtime="triton",
        models=("acme/tri-embed",),
        embeddings=EMBED_NAMES,
    )
    assert Worker.objects.get(worker_id="triton-embed").healthy
    ai: openai.OpenAI = world["ai"]
    answer = ai.embeddings.create(model="acme/tri-embed", input=["alpha beta", "gamma"], encoding_format="float")
    assert [d.embedding for d in answer.data] == [[2.0, 10.0, 0.5, -0.25], [1.0, 5.0, 0.5, -0.25]]
    assert answer.usage.prompt_tokens == 3 and answer.model == "acme/tri-embed"
    raw = httpx.post(
        world["url"] + "/v1/embeddings",
        headers={"Authorization": f"Bearer {world['secret']}"},
        json={"model": "acme/tri-embed", "input": "alpha beta", "encoding_format": "base64"},
    ).json()
    packed = base64.b64decode(raw["data"][0]["embedding"])
    assert list(struct.unpack("<4f", packed)) == [2.0, 10.0, 0.5, -0.25]
    assert ai.embeddings.create(model="acme/tri-embed", input="alpha beta").data[0].embedding == [2.0, 10.0, 0.5, -0.25]
    costs = list(UsageRecord.objects.order_by("id").values_list("endpoint", "prompt_tokens", "cost"))
    assert costs == [("/v1/embeddings", 3, 6), ("/v1/embeddings", 2, 4), ("/v1/embeddings", 2, 4)]
    # The model refusing an input longer than its context: 400 in its own words, nothing charged, circuit clean.
    before = available(world)
    with pytest.raises(openai.BadRequestError) as info:
        ai.embeddings.create(model="acme/tri-embed", input=" ".join(["w"] * 20))
    assert info.value.body["code"] == "invalid_request"  # type: ignore[index]
    assert "more than the model's context of 16" in info.value.body["message"]  # type: ignore[index]
    assert triton_server.url.split("://")[1] not in str(info.value.body)
    assert available(world) == before
    assert Worker.objects.get(worker_id="triton-embed").consecutive_failures == 0
    # Chat on an embeddings-only Triton worker is refused, not crashed.
    with pytest.raises(openai.BadRequestError) as chat:
        ai.chat.completions.create(model="acme/tri-embed", messages=[{"role": "user", "content": "hi"}])
    assert "embeddings only" in chat.value.body["message"]  # type: ignore[index]
