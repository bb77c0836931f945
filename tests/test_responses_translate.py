"""The Responses API <-> chat completions translation (runtimes.responses), on its own.

Requests are shaped like the OpenAI API reference's examples for POST /v1/responses; every output
is validated with the openai SDK's own types (openai.types.responses), and the streamed events are
fed through the SDK's `client.responses.stream()` state machine (ResponseStreamState).
"""

from __future__ import annotations

from typing import Any

import pytest
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from openai.types.responses.response_stream_event import ResponseStreamEvent as EventUnion
from pydantic import TypeAdapter

from runtimes.request import CompletionParams, Usage
from runtimes.responses import ResponseEvents, Untranslatable, chat_params, chat_request, response_from_chat

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get current temperature for a given location.",
    "parameters": {
        "type": "object",
        "properties": {"location": {"type": "string", "description": "City and country e.g. Bogotá, Colombia"}},
        "required": ["location"],
        "additionalProperties": False,
    },
    "strict": True,
}


def test_a_string_input_with_instructions_is_a_system_and_a_user_message() -> None:
    chat = chat_request(
        {
            "model": "acme/chat-1",
            "instructions": "Talk like a pirate.",
            "input": "Are semicolons optional in JavaScript?",
            "max_output_tokens": 50,
            "temperature": 0.2,
            "top_p": 0.9,
        }
    )
    assert chat == {
        "model": "acme/chat-1",
        "messages": [
            {"role": "system", "content": "Talk like a pirate."},
            {"role": "user", "content": "Are semicolons optional in JavaScript?"},
        ],
        "max_completion_tokens": 50,
        "temperature": 0.2,
        "top_p": 0.9,
    }


def test_a_message_list_with_text_parts_and_a_tool_round_trip() -> None:
    body = {
        "model": "acme/chat-1",
        "tools": [WEATHER_TOOL],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "input": [
            {"role": "developer", "content": "Answer briefly."},
            {"role": "user", "content": [{"type": "input_text", "text": "What is the weather like in Paris today?"}]},
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_12345xyz",
                "name": "get_weather",
                "arguments": '{"location":"Paris, France"}',
            },
            {"type": "function_call_output", "call_id": "call_12345xyz", "output": "14°C"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is 14°C."}]},
        ],
    }
    chat = chat_request(body)
    assert chat["messages"] == [
        {"role": "developer", "content": "Answer briefly."},
        {"role": "user", "content": "What is the weather like in Paris today?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_12345xyz",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"location":"Paris, France"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_12345xyz", "content": "14°C"},
        {"role": "assistant", "content": "It is 14°C."},
    ]
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": WEATHER_TOOL["description"],
                "parameters": WEATHER_TOOL["parameters"],
                "strict": True,
            },
        }
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}


def test_a_json_schema_text_format_is_a_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    chat = chat_request(
        {"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "name": "thing", "schema": schema}}}
    )
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "thing", "schema": schema}}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"background": True}, "background"),
        ({"tools": [{"type": "web_search"}]}, "tools[0]"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
            "input[0].content[0]",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"input": [{"type": "reasoning", "id": "rs_1", "summary": []}]}, "input[0].type"),
        ({"truncation": "auto"}, "truncation"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"input": []}, "input"),
        ({"instructions": ["not", "a", "string"]}, "instructions"),
    ],
)
def test_what_has_no_chat_equivalent_is_refused_naming_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(Untranslatable) as refused:
        chat_request({"model": "m", "input": "hello", **body})
    assert refused.value.param == param
    assert param in str(refused.value)


def test_chat_params_bound_every_prompt_text() -> None:
    params = CompletionParams(
        endpoint="responses",
        body={"model": "m", "instructions": "be brief", "input": "hello", "tools": [WEATHER_TOOL]},
        model="m",
        stream=False,
        include_usage=False,
        max_tokens=20,
        texts=[],
        messages=[],
        prompt="",
    )
    chat = chat_params(params)
    assert chat.endpoint == "chat" and chat.max_tokens == 20
    assert chat.texts[:2] == ["be brief", "hello"] and "get_weather" in chat.texts[2]


def _chat_answer(message: dict[str, Any], finish_reason: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1741476542,
        "model": "acme/chat-1",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish_reason}],
        "usage": {
            "prompt_tokens": 36,
            "completion_tokens": 87,
            "total_tokens": 123,
            "prompt_tokens_details": {"cached_tokens": 4},
            "completion_tokens_details": {"reasoning_tokens": 0},
        },
    }


def test_a_chat_answer_is_a_response_the_sdk_parses() -> None:
    body = {"model": "acme/chat-1", "input": "Tell me a three sentence bedtime story about a unicorn."}
    data = response_from_chat(
        answer=_chat_answer({"content": "In a peaceful grove..."}), usage=Usage(36, 87), body=body, model="acme/chat-1"
    )
    response = Response.model_validate(data)
    assert response.output_text == "In a peaceful grove..."
    assert response.status == "completed" and response.model == "acme/chat-1" and response.id.startswith("resp_")
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (36, 87, 123)
    assert response.usage.input_tokens_details.cached_tokens == 4
    assert response.usage.output_tokens_details.reasoning_tokens == 0


def test_a_chat_tool_call_is_a_function_call_item() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"location":"x"}'}}
    body = {"model": "m", "input": "weather?", "tools": [WEATHER_TOOL]}
    data = response_from_chat(
        answer=_chat_answer({"content": None, "tool_calls": [call]}, "tool_calls"),
        usage=Usage(5, 7),
        body=body,
        model="m",
    )
    response = Response.model_validate(data)
    (item,) = response.output
    assert item.type == "function_call"
    assert (item.call_id, item.name, item.arguments) == ("call_1", "get_weather", '{"location":"x"}')
    assert response.tools[0].type == "function"


def test_a_cut_answer_is_incomplete_for_max_output_tokens() -> None:
    data = response_from_chat(
        answer=_chat_answer({"content": "In a"}, "length"), usage=Usage(3, 2), body={"model": "m"}, model="m"
    )
    response = Response.model_validate(data)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"


def _chunk(delta: dict[str, Any] | None = None, finish: str | None = None, usage: Any = None) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    chunk: dict[str, Any] = {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": choices,
    }
    if usage is not None:
        chunk["usage"] = usage
    return chunk


def _through_the_sdk(events: list[dict[str, Any]], tools: list[Any] | None = None) -> Response:
    """Feed the events through the SDK's stream helper, as `client.responses.stream()` does."""
    adapter: TypeAdapter[ResponseStreamEvent] = TypeAdapter(EventUnion)
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=tools or [], text_format=omit)
    numbers = [e["sequence_number"] for e in events]
    assert numbers == list(range(len(events)))
    final = None
    for raw in events:
        for event in state.handle_event(adapter.validate_python(raw)):
            if event.type == "response.completed":
                final = event.response
    assert final is not None
    return final


def test_chat_chunks_are_the_events_the_sdk_stream_helper_accepts() -> None:
    events = ResponseEvents(body={"model": "m", "input": "hi"}, model="m")
    out = events.start()
    out += events.feed(_chunk({"role": "assistant", "content": ""}))
    for word in ("Speed", "Infer", "."):
        out += events.feed(_chunk({"content": word}))
    out += events.feed(_chunk({}, "stop"))
    out += events.feed(_chunk(usage={"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}))
    out += events.finish()
    assert [e["type"] for e in out] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = _through_the_sdk(out)
    assert final.output_text == "SpeedInfer."
    assert final.usage is not None and (final.usage.input_tokens, final.usage.output_tokens) == (9, 3)


def test_streamed_tool_calls_are_function_call_argument_events() -> None:
    events = ResponseEvents(body={"model": "m", "input": "hi", "tools": [WEATHER_TOOL]}, model="m")
    out = events.start()
    first = {"index": 0, "id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    out += events.feed(_chunk({"role": "assistant", "tool_calls": [first]}))
    out += events.feed(_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"location":'}}]}))
    out += events.feed(_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}))
    second = {"index": 1, "id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    out += events.feed(_chunk({"tool_calls": [second]}, "tool_calls"))
    out += events.feed(_chunk(usage={"prompt_tokens": 20, "completion_tokens": 11}))
    out += events.finish()
    kinds = [e["type"] for e in out]
    assert kinds.count("response.function_call_arguments.delta") == 3
    assert kinds.count("response.function_call_arguments.done") == 2
    final = _through_the_sdk(out, tools=[WEATHER_TOOL])
    calls = [(i.call_id, i.arguments) for i in final.output if i.type == "function_call"]
    assert calls == [("call_a", '{"location":"Paris"}'), ("call_b", "{}")]


def test_a_stream_cut_by_the_token_limit_completes_with_an_incomplete_response() -> None:
    events = ResponseEvents(body={"model": "m", "input": "hi"}, model="m")
    out = events.start()
    out += events.feed(_chunk({"content": "a"}, "length"))
    out += events.feed(_chunk(usage={"prompt_tokens": 1, "completion_tokens": 1}))
    out += events.finish()
    # response.completed (what the SDK's get_final_response needs), its response saying why it stopped.
    assert out[-1]["type"] == "response.completed"
    final = _through_the_sdk(out)
    assert final.status == "incomplete"
    assert final.incomplete_details is not None and final.incomplete_details.reason == "max_output_tokens"


def test_reasoning_comes_back_as_a_reasoning_item() -> None:
    answer = _chat_answer({"reasoning_content": "Think first.", "content": "Done."})
    response = Response.model_validate(response_from_chat(answer=answer, usage=Usage(1, 2), body={}, model="m"))
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "message"] and response.output_text == "Done."
    reasoning = response.output[0]
    assert reasoning.type == "reasoning" and reasoning.content is not None
    assert reasoning.content[0].text == "Think first."


def test_streamed_reasoning_is_reasoning_text_events_before_the_message() -> None:
    events = ResponseEvents(body={"model": "m", "input": "hi"}, model="m")
    out = events.start()
    out += events.feed(_chunk({"role": "assistant", "reasoning_content": "Hmm"}))
    out += events.feed(_chunk({"reasoning": ", yes."}))
    out += events.feed(_chunk({"content": "Yes."}, "stop"))
    out += events.feed(_chunk(usage={"prompt_tokens": 2, "completion_tokens": 3}))
    out += events.finish()
    kinds = [e["type"] for e in out]
    assert kinds.count("response.reasoning_text.delta") == 2
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    final = _through_the_sdk(out)
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output_text == "Yes."
