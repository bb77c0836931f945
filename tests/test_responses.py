"""POST /v1/responses and POST /v1/rerank end to end: the openai SDK (responses.create / .stream) and httpx
against the gateway and the worker simulator (translated to chat completions), a worker serving the
Responses API itself (forwarded), and the real tritonserver (translated); money to the micro-credit."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import orjson
import pytest
from aiohttp import web

from billing.models import Reservation, UsageRecord
from core.credits import MICRO
from devtools.simulator import Simulator, SimulatorThread
from tests.factories import make_account, make_key, make_model, money
from tests.servers import register_worker
from tests.test_gateway_triton import NAMES

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_gateway")]

TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Look a phrase up.",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
}


def cost(prompt: int, completion: int) -> int:
    """Micro-credits at 1 credit per 1M prompt tokens and 2 per 1M completion tokens, rounded up."""
    return -(-(prompt * MICRO + completion * 2 * MICRO) // 1_000_000)


@pytest.fixture
def world(gateway_server, simulator):
    make_model(model_id="acme/model-1", max_output_tokens=64)
    account = make_account(name="owner", credits=10)
    created = make_key(account=account, name="k1")
    register_worker(simulator.base_url)
    ai = openai.OpenAI(base_url=gateway_server.url + "/v1", api_key=created.secret, max_retries=0)
    return {"account": account, "secret": created.secret, "url": gateway_server.url, "ai": ai}


def test_responses_create_is_translated_to_chat_and_settled_like_it(world, simulator):
    response = world["ai"].responses.create(
        model="acme/model-1", instructions="Be brief.", input="say hello [sim deltas=5]", max_output_tokens=20
    )
    assert response.object == "response" and response.status == "completed"
    assert response.model == "acme/model-1"
    assert response.output_text == "SpeedInfer routes every request"
    # The simulator counts words: "Be brief." (2) + "say hello [sim deltas=5]" (4).
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (6, 5, 11)
    sent = simulator.simulator.stats.requests[-1]
    assert sent["path"] == "/v1/chat/completions"
    assert sent["body"]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "say hello [sim deltas=5]"},
    ]
    assert sent["body"]["max_completion_tokens"] == 20
    record = UsageRecord.objects.get()
    assert (record.endpoint, record.prompt_tokens, record.completion_tokens) == ("/v1/responses", 6, 5)
    assert record.cost == cost(6, 5)
    assert money(world["account"]) == (10 * MICRO - cost(6, 5), 0)
    # Reserved as a chat completion: the prompt bound plus max_output_tokens at the output price.
    assert Reservation.objects.get().amount > cost(0, 20)


def test_a_message_list_with_a_function_call_and_its_output(world, simulator):
    response = world["ai"].responses.create(
        model="acme/model-1",
        tools=[TOOL],
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "find it"}]},
            {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": '{"text":"x"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "found [sim deltas=2]"},
        ],
    )
    assert response.output_text == "SpeedInfer"
    messages = simulator.simulator.stats.requests[-1]["body"]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["tool_calls"][0]["function"] == {"name": "lookup", "arguments": '{"text":"x"}'}
    assert messages[2] == {"role": "tool", "tool_call_id": "call_1", "content": "found [sim deltas=2]"}


def test_a_function_tool_call_comes_back_as_a_function_call_item(world):
    response = world["ai"].responses.create(
        model="acme/model-1", input="look up [sim deltas=3]", tools=[TOOL], tool_choice="required"
    )
    (call,) = response.output
    assert call.type == "function_call" and call.name == "lookup"
    assert orjson.loads(call.arguments) == {"text": "SpeedInfer routes"}
    assert response.usage is not None and response.usage.output_tokens == 3


def test_responses_stream_gives_the_sdk_helper_its_events_and_charges_once(world):
    with world["ai"].responses.stream(model="acme/model-1", input="stream me [sim deltas=4]") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds.count("response.output_text.delta") == 4
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert final.output_text == "SpeedInfer routes every"
    assert final.usage is not None and (final.usage.input_tokens, final.usage.output_tokens) == (4, 4)
    record = UsageRecord.objects.get()
    assert (record.endpoint, record.cost) == ("/v1/responses", cost(4, 4))
    assert money(world["account"]) == (10 * MICRO - cost(4, 4), 0)


def test_a_streamed_function_call_has_its_argument_events(world):
    with world["ai"].responses.stream(
        model="acme/model-1", input="look up [sim deltas=3]", tools=[TOOL], tool_choice="required"
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds
    assert "response.function_call_arguments.done" in kinds
    (call,) = final.output
    assert call.type == "function_call" and orjson.loads(call.arguments) == {"text": "SpeedInfer routes"}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"store": True}, "store"),
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"tools": [{"type": "web_search"}]}, "tools[0]"),
    ],
)
def test_state_and_what_cannot_be_translated_are_refused_naming_the_field(world, extra, param):
    with pytest.raises(openai.BadRequestError) as refused:
        world["ai"].responses.create(model="acme/model-1", input="hi", **extra)
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] == "invalid_request" and error["param"] == param
    if param in ("store", "previous_response_id"):
        assert "keeps no" in error["message"]
    assert money(world["account"]) == (10 * MICRO, 0)
    assert not UsageRecord.objects.filter(status="ok").exists()


def test_responses_need_the_chat_scope(world):
    narrow = make_key(account=world["account"], scopes=["embeddings"]).secret
    answer = httpx.post(
        world["url"] + "/v1/responses",
        json={"model": "acme/model-1", "input": "hi"},
        headers={"Authorization": f"Bearer {narrow}"},
    )
    assert answer.status_code == 403 and answer.json()["error"]["code"] == "insufficient_scope"


class NativeResponses(Simulator):
    """A worker that serves the Responses API itself (as vLLM does), and records what it was sent."""

    def app(self) -> web.Application:
        app = super().app()
        app.router.add_post("/v1/responses", self.responses)
        return app

    async def responses(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.stats.requests.append({"path": request.path, "body": body})
        usage = {
            "input_tokens": 10,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 2,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 12,
        }
        item: dict[str, Any] = {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant"}
        item["content"] = [{"type": "output_text", "text": "native", "annotations": []}]
        response: dict[str, Any] = {
            "id": "resp_native",
            "object": "response",
            "created_at": 1,
            "status": "completed",
            "model": body["model"],
            "output": [item],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": usage,
        }
        if not body.get("stream"):
            return web.json_response(response)
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        started = {**response, "status": "in_progress", "output": [], "usage": None}
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": started},
            {"type": "response.output_item.added", "output_index": 0, "item": {**item, "content": []}},
            {"type": "response.completed", "response": response},
        ]
        for n, event in enumerate(events):
            data = orjson.dumps({**event, "sequence_number": n})
            await stream.write(b"event: " + event["type"].encode() + b"\ndata: " + data + b"\n\n")
        await stream.write_eof()
        return stream


def test_a_worker_declaring_responses_gets_the_body_as_it_is(world):
    native = SimulatorThread(NativeResponses(models=("acme/model-1",))).start()
    try:
        register_worker(native.base_url, worker_id="native-1", responses=True)
        reasoning: Any = {"effort": "low"}  # not translatable, but the native worker takes it
        response = world["ai"].responses.create(model="acme/model-1", input="hi", reasoning=reasoning)
        assert response.output_text == "native" and response.model == "acme/model-1"
        sent = native.simulator.stats.requests[-1]
        assert sent["path"] == "/v1/responses"
        assert sent["body"]["reasoning"] == reasoning and sent["body"]["store"] is False
        assert sent["body"]["max_output_tokens"] == 64
        with world["ai"].responses.stream(model="acme/model-1", input="hi") as stream:
            final = stream.get_final_response()
        assert final.model == "acme/model-1"
        records = UsageRecord.objects.order_by("id")
        assert [(r.worker_id, r.prompt_tokens, r.completion_tokens) for r in records] == [("native-1", 10, 2)] * 2
        assert money(world["account"]) == (10 * MICRO - 2 * cost(10, 2), 0)
    finally:
        native.stop()


def test_a_responses_flag_that_is_not_a_boolean_is_refused_at_registration(world, simulator):
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError) as refused:
        register_worker(simulator.base_url, worker_id="bad", responses="yes")
    assert "runtime_config.responses" in str(refused.value)


def rerank(world: dict[str, Any], body: dict[str, Any], secret: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {secret or world['secret']}"}
    return httpx.post(world["url"] + "/v1/rerank", json=body, headers=headers, timeout=10)


def test_rerank_is_forwarded_and_settled_at_the_input_price(world, simulator):
    documents = ["the cat sat", "GPU workers route requests", "requests for GPU time"]
    answer = rerank(world, {"model": "acme/model-1", "query": "GPU requests", "documents": documents, "top_n": 2})
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert data["model"] == "acme/model-1"
    assert [r["index"] for r in data["results"]] == [1, 2]
    assert data["results"][0]["relevance_score"] == 1.0
    assert simulator.simulator.stats.requests[-1]["path"] == "/v1/rerank"
    tokens = 2 + 3 + 4 + 4  # words of the query and the documents
    assert data["usage"]["prompt_tokens"] == tokens
    record = UsageRecord.objects.get()
    assert (record.endpoint, record.prompt_tokens, record.completion_tokens) == ("/v1/rerank", tokens, 0)
    assert record.cost == cost(tokens, 0)
    assert money(world["account"]) == (10 * MICRO - cost(tokens, 0), 0)
    # Reserved: the query and documents' bound at the input price, no output.
    reserved = Reservation.objects.get().amount
    assert cost(tokens, 0) <= reserved < cost(200, 0)


def test_rerank_needs_the_embeddings_scope_and_a_valid_body(world):
    narrow = make_key(account=world["account"], scopes=["chat"]).secret
    answer = rerank(world, {"model": "acme/model-1", "query": "q", "documents": ["d"]}, narrow)
    assert answer.status_code == 403 and answer.json()["error"]["code"] == "insufficient_scope"
    for body, param in (
        ({"model": "acme/model-1", "documents": ["d"]}, "query"),
        ({"model": "acme/model-1", "query": "q", "documents": [1]}, "documents"),
        ({"model": "acme/model-1", "query": "q", "documents": ["d"], "top_n": 0}, "top_n"),
    ):
        refused = rerank(world, body)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param
    assert money(world["account"]) == (10 * MICRO, 0)


@pytest.mark.triton
def test_responses_on_the_real_tritonserver_are_translated(gateway_server, triton_server):
    account = make_account(name="triton-customer", credits=10)
    make_model(model_id="acme/tri", max_output_tokens=32)
    register_worker(
        triton_server.url,
        worker_id="triton-1",
        runtime="triton",
        models=("acme/tri",),
        model_name="text_generation",
        **NAMES,
    )
    ai = openai.OpenAI(base_url=gateway_server.url + "/v1", api_key=make_key(account=account).secret, max_retries=0)
    response = ai.responses.create(model="acme/tri", input="one two three four five", max_output_tokens=3)
    # The default template renders "user: one two three four five\nassistant:"; the test model echoes words.
    assert response.output_text == "user: one two"
    assert response.status == "incomplete"  # cut by max_output_tokens
    assert response.usage is not None and (response.usage.input_tokens, response.usage.output_tokens) == (7, 3)
    record = UsageRecord.objects.get()
    assert (record.endpoint, record.worker_id, record.prompt_tokens, record.completion_tokens) == (
        "/v1/responses",
        "triton-1",
        7,
        3,
    )
    assert money(account) == (10 * MICRO - record.cost, 0)
    with pytest.raises(openai.BadRequestError) as refused:
        ai.responses.create(model="acme/tri", input="hi", tools=[TOOL])  # type: ignore[list-item]
    assert refused.value.body["param"] == "tools"  # type: ignore[index]
    # Triton workers do not rerank: refused as the client's mistake, the worker not counted as failing.
    ranked = httpx.post(
        gateway_server.url + "/v1/rerank",
        json={"model": "acme/tri", "query": "q", "documents": ["d"]},
        headers={"Authorization": f"Bearer {ai.api_key}"},
    )
    assert ranked.status_code == 400 and "rerank" in ranked.json()["error"]["message"]
    assert money(account) == (10 * MICRO - record.cost, 0)


def test_a_client_leaving_a_responses_stream_pays_for_the_deltas_it_was_sent(world, simulator):
    payload = {"model": "acme/model-1", "stream": True, "input": "long story [sim deltas=40 delay=150]"}
    seen = 0
    with httpx.stream(
        "POST", world["url"] + "/v1/responses", json=payload, headers={"Authorization": f"Bearer {world['secret']}"}
    ) as response:
        for line in response.iter_lines():
            if line == "event: response.output_text.delta":
                seen += 1
                if seen == 2:
                    break
    deadline = time.monotonic() + 10
    while not UsageRecord.objects.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    record = UsageRecord.objects.get()
    assert record.status == "client_disconnected"
    assert 2 <= record.completion_tokens <= 4  # what was sent before the gateway noticed, not the 40 asked for
    assert record.prompt_tokens == -(-len(b"long story [sim deltas=40 delay=150]") // 4)
    assert money(world["account"]) == (10 * MICRO - record.cost, 0)


def test_an_idempotency_key_replays_a_response_without_a_second_charge(world):
    ai = world["ai"]
    headers = {"Idempotency-Key": "resp-once-1"}
    body = {"model": "acme/model-1", "input": "once [sim deltas=3]"}
    first = ai.responses.with_raw_response.create(**body, extra_headers=headers)
    deadline = time.monotonic() + 5
    while True:
        try:
            # The answer leaves before the key's record is written: a repeat right after may see it running.
            again = ai.responses.with_raw_response.create(**body, extra_headers=headers)
            break
        except openai.ConflictError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert again.headers["idempotent-replayed"] == "true"
    assert again.parse().id == first.parse().id
    assert UsageRecord.objects.count() == 1
    assert money(world["account"]) == (10 * MICRO - UsageRecord.objects.get().cost, 0)


@pytest.mark.triton
def test_a_responses_stream_on_a_streaming_tritonserver_model_is_translated(gateway_server, triton_server):
    from tests.test_triton_streaming import NAMES as STREAM_NAMES
    from tests.test_triton_streaming import WORDS

    account = make_account(name="triton-streamer", credits=10)
    make_model(model_id="acme/tri-stream", max_output_tokens=32)
    register_worker(
        triton_server.url,
        worker_id="triton-stream",
        runtime="triton",
        models=("acme/tri-stream",),
        model_name="text_stream",
        **STREAM_NAMES,
    )
    ai = openai.OpenAI(base_url=gateway_server.url + "/v1", api_key=make_key(account=account).secret, max_retries=0)
    with ai.responses.stream(model="acme/tri-stream", input=WORDS, max_output_tokens=6) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    # The model echoes the rendered prompt "user: one two ...", one word per event, as the chat stream does.
    assert "".join(deltas) == final.output_text == "user: one two three four five"
    assert len(deltas) == 6
    assert final.status == "incomplete" and final.model == "acme/tri-stream"
    assert final.usage is not None and (final.usage.input_tokens, final.usage.output_tokens) == (10, 6)
    record = UsageRecord.objects.get()
    assert (record.endpoint, record.prompt_tokens, record.completion_tokens) == ("/v1/responses", 10, 6)
    assert money(account) == (10 * MICRO - record.cost, 0)


def test_a_worker_failing_mid_stream_ends_it_with_an_error_event_and_charges_nothing(world):
    payload = {"model": "acme/model-1", "stream": True, "input": "fail [sim deltas=10 cut=3]"}
    with httpx.stream(
        "POST", world["url"] + "/v1/responses", json=payload, headers={"Authorization": f"Bearer {world['secret']}"}
    ) as response:
        lines = [line for line in response.iter_lines() if line]
    kinds = [line[7:] for line in lines if line.startswith("event: ")]
    assert kinds[0] == "response.created" and kinds[-1] == "error" and "response.completed" not in kinds
    error = orjson.loads(lines[-1][6:])
    assert error["code"] == "upstream_error" and error["sequence_number"] == len(kinds) - 1
    assert money(world["account"]) == (10 * MICRO, 0)
