"""The Responses API translated to and from chat completions (docs/api.md, "The Responses API").

Pure functions, no I/O: a worker that speaks only chat completions (every Triton worker, most
OpenAI-compatible ones) serves `POST /v1/responses` through them (`WorkerClient.respond`):

    chat_request(body)              Responses request body  -> chat completions body
    response_from_chat(...)         chat completion answer  -> Response object
    ResponseEvents                  chat completion chunks  -> Responses stream events

What has no chat-completions equivalent raises `Untranslatable` naming the field: a request is never
answered with a feature silently dropped. The shapes follow the openai SDK's `openai.types.responses`
(the tests validate every output with them) and the event order its `client.responses.stream()` helper
accepts: created, in_progress, then per output item added -> (content_part.added -> output_text.delta...
-> output_text.done -> content_part.done | function_call_arguments.delta... -> .done) -> output_item.done,
then response.completed with usage (its status "incomplete" when the token limit cut the answer).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

from runtimes.request import CHAT, CompletionParams, Usage, is_token_count

# Fields of a Responses request that the translation understands; anything else is Untranslatable.
_TRANSLATED = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_output_tokens",
        "temperature",
        "top_p",
        "stream",
        "store",
        "metadata",
        "user",
        "text",
        "truncation",
        "prompt_cache_key",
        "safety_identifier",
        "include",
        "stream_options",
    }
)
_ROLES = frozenset({"user", "system", "developer", "assistant"})
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})


class Untranslatable(ValueError):
    """A Responses request (or part of one) that chat completions cannot express; `param` names it."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def _refuse(param: str, why: str) -> Untranslatable:
    return Untranslatable(f"'{param}' {why}", param)


def _text_of(content: Any, param: str) -> str:
    """A message's content (a string or a list of text parts) as one string."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _refuse(param, "must be a string or an array of content parts")
    texts = []
    for j, part in enumerate(content):
        where = f"{param}[{j}]"
        if not isinstance(part, dict):
            raise _refuse(where, "must be a content part object")
        kind = part.get("type")
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        else:
            raise _refuse(where, f"of type {kind!r} is not translated to chat completions (text parts only)")
    return "".join(texts)


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise _refuse("instructions", "must be a string")
        messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
        return messages
    if not isinstance(items, list) or not items:
        raise _refuse("input", "must be a string or a non-empty array of input items")
    for i, item in enumerate(items):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise _refuse(param, "must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise _refuse(f"{param}.role", f"must be one of {', '.join(sorted(_ROLES))}")
            messages.append({"role": role, "content": _text_of(item.get("content"), f"{param}.content")})
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
            if not all(isinstance(v, str) for v in (call_id, name, arguments)):
                raise _refuse(param, "(a function_call) needs call_id, name and arguments as strings")
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            last = messages[-1] if messages else None
            # Consecutive calls are one assistant turn with several tool_calls, as chat completions has them.
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str):
                raise _refuse(f"{param}.call_id", "must be a string")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": _text_of(output, f"{param}.output")})
        elif kind == "item_reference":
            raise _refuse(param, "refers to a stored item; this service keeps no state (send the item itself)")
        else:
            raise _refuse(f"{param}.type", f"{kind!r} is not translated to chat completions")
    return messages


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise _refuse("tools", "must be an array")
    translated = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise _refuse(f"tools[{i}]", f"of type {kind!r} is not translated (function tools only)")
        if not isinstance(tool.get("name"), str):
            raise _refuse(f"tools[{i}].name", "must be a string")
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        translated.append({"type": "function", "function": function})
    return translated or None


def _tool_choice(choice: Any) -> Any:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _refuse("tool_choice", "must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}")


def _response_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
        raise _refuse("text", "may hold only 'format'")
    if text.get("verbosity") is not None:
        raise _refuse("text.verbosity", "is not translated to chat completions")
    fmt = text.get("format")
    if fmt is None or fmt == {"type": "text"}:
        return None
    if isinstance(fmt, dict) and fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict):
        schema = {k: fmt[k] for k in ("name", "description", "schema", "strict") if fmt.get(k) is not None}
        return {"type": "json_schema", "json_schema": schema}
    raise _refuse("text.format", "must be text, json_object or json_schema with a schema")


def chat_request(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completions body that asks what the Responses request `body` asks, or Untranslatable."""
    for name in body:
        if name not in _TRANSLATED and body[name] is not None:
            raise _refuse(name, "is not translated to chat completions")
    if body.get("truncation") not in (None, "disabled"):
        raise _refuse("truncation", "must be 'disabled' (the prompt is never cut)")
    if body.get("include"):
        raise _refuse("include", "is not translated to chat completions")
    chat: dict[str, Any] = {"model": body["model"], "messages": _messages(body)}
    tools = _tools(body)
    if tools:
        chat["tools"] = tools
        if body.get("tool_choice") is not None:
            chat["tool_choice"] = _tool_choice(body["tool_choice"])
        if body.get("parallel_tool_calls") is not None:
            chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    elif body.get("tool_choice") not in (None, "auto", "none"):
        raise _refuse("tool_choice", "names a tool but 'tools' is empty")
    response_format = _response_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    for source, target in (
        ("max_output_tokens", "max_completion_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("user", "user"),
        ("prompt_cache_key", "prompt_cache_key"),
        ("safety_identifier", "safety_identifier"),
    ):
        if body.get(source) is not None:
            chat[target] = body[source]
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def chat_params(params: CompletionParams) -> CompletionParams:
    """A parsed Responses request (`params.body` the Responses body) as the chat request a worker runs."""
    chat = chat_request(params.body)
    texts = []
    for message in chat["messages"]:
        if message.get("content"):
            texts.append(message["content"])
        if message.get("tool_calls"):
            texts.append(orjson.dumps(message["tool_calls"]).decode())
    for extra in ("tools", "response_format"):
        if chat.get(extra) is not None:
            texts.append(orjson.dumps(chat[extra]).decode())
    return CompletionParams(
        endpoint=CHAT,
        body=chat,
        model=params.model,
        stream=params.stream,
        include_usage=True,
        max_tokens=params.max_tokens,
        texts=texts,
        messages=chat["messages"],
        prompt="",
    )


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def responses_usage(usage: Usage, details: Any = None) -> dict[str, Any]:
    """A Response's usage from the chat answer's (`details`: its usage object, for cached / reasoning)."""
    cached = reasoning = 0
    if isinstance(details, dict):
        prompt_details = details.get("prompt_tokens_details")
        completion_details = details.get("completion_tokens_details")
        if isinstance(prompt_details, dict) and is_token_count(prompt_details.get("cached_tokens")):
            cached = prompt_details["cached_tokens"]
        if isinstance(completion_details, dict) and is_token_count(completion_details.get("reasoning_tokens")):
            reasoning = completion_details["reasoning_tokens"]
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def usage_of_response(data: Any) -> Usage | None:
    """Authoritative usage from a Response object's `usage` (input_tokens / output_tokens), or None."""
    usage = data.get("usage") if isinstance(data, dict) else None
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("input_tokens"), usage.get("output_tokens")
    if not is_token_count(prompt) or not is_token_count(completion):
        return None
    return Usage(prompt, completion)


def response_object(
    *,
    body: dict[str, Any],
    model: str,
    response_id: str,
    created_at: int,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    """A Response object echoing the request's settings (the fields the SDK's `Response` requires)."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "store": False,
        "temperature": body.get("temperature"),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p"),
        "truncation": "disabled",
        "metadata": body.get("metadata") or {},
        "user": body.get("user"),
        "usage": usage,
    }


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = (
        [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status == "completed" else []
    )
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _reasoning_of(message: dict[str, Any]) -> str:
    """A chat message's (or delta's) reasoning text: vLLM's `reasoning_content`, or `reasoning`."""
    value = message.get("reasoning_content") or message.get("reasoning")
    return value if isinstance(value, str) else ""


def _reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if status == "completed" else []
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content, "status": status}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def response_from_chat(*, answer: dict[str, Any], usage: Usage, body: dict[str, Any], model: str) -> dict[str, Any]:
    """The Response object for a chat completion `answer` to the translated request `body`."""
    choices = answer.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = _object(choice.get("message"))
    output: list[dict[str, Any]] = []
    reasoning = _reasoning_of(message)
    if reasoning:
        output.append(_reasoning_item(new_id("rs"), reasoning))
    if message.get("content"):
        output.append(_message_item(new_id("msg"), str(message["content"])))
    for call in message.get("tool_calls") or []:
        call = _object(call)
        function = _object(call.get("function"))
        output.append(
            _call_item(
                new_id("fc"),
                str(call.get("id") or new_id("call")),
                str(function.get("name", "")),
                str(function.get("arguments") or ""),
            )
        )
    status = "incomplete" if choice.get("finish_reason") == "length" else "completed"
    return response_object(
        body=body,
        model=model,
        response_id=new_id("resp"),
        created_at=int(answer.get("created") or time.time()),
        status=status,
        output=output,
        usage=responses_usage(usage, answer.get("usage")),
    )


@dataclass
class _OpenItem:
    index: int
    item: dict[str, Any]
    text: list[str] = field(default_factory=list)  # a message's text, or a call's arguments


class ResponseEvents:
    """Chat completion chunks in, Responses stream events out (each a dict with its sequence_number).

    `start()` first, `feed(chunk)` per chunk, `finish()` once the chat stream ended (its usage chunk
    seen): that closes the open items and ends with response.completed with usage."""

    def __init__(self, *, body: dict[str, Any], model: str) -> None:
        self.body = body
        self.model = model
        self.response_id = new_id("resp")
        self.created_at = int(time.time())
        self.sequence = 0
        self.usage: Usage | None = None
        self.usage_details: Any = None
        self.finish_reason: str | None = None
        self.done: list[dict[str, Any]] = []  # finished output items, in output_index order
        self.message: _OpenItem | None = None
        self.reasoning: _OpenItem | None = None
        self.calls: dict[int, _OpenItem] = {}  # chat's tool-call index -> its open item
        self.next_index = 0

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def _response(self, status: str, usage: dict[str, Any] | None = None) -> dict[str, Any]:
        output = self.done if status != "in_progress" else []
        return response_object(
            body=self.body,
            model=self.model,
            response_id=self.response_id,
            created_at=self.created_at,
            status=status,
            output=output,
            usage=usage,
        )

    def start(self) -> list[dict[str, Any]]:
        response = self._response("in_progress")
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
        ]

    def _close_reasoning(self) -> list[dict[str, Any]]:
        open_item, self.reasoning = self.reasoning, None
        if open_item is None:
            return []
        text, item_id, index = "".join(open_item.text), open_item.item["id"], open_item.index
        item = _reasoning_item(item_id, text)
        self.done.append(item)
        return [
            self._event(
                "response.reasoning_text.done", item_id=item_id, output_index=index, content_index=0, text=text
            ),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def _close_message(self) -> list[dict[str, Any]]:
        open_item, self.message = self.message, None
        if open_item is None:
            return []
        text, item_id, index = "".join(open_item.text), open_item.item["id"], open_item.index
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        item = _message_item(item_id, text)
        self.done.append(item)
        common = {"item_id": item_id, "output_index": index, "content_index": 0}
        return [
            self._event("response.output_text.done", text=text, logprobs=[], **common),
            self._event("response.content_part.done", part=part, **common),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def _close_calls(self) -> list[dict[str, Any]]:
        events = []
        for open_item in self.calls.values():
            arguments, item = "".join(open_item.text), open_item.item
            done = _call_item(item["id"], item["call_id"], item["name"], arguments)
            self.done.append(done)
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=open_item.index,
                    name=item["name"],
                    arguments=arguments,
                )
            )
            events.append(self._event("response.output_item.done", output_index=open_item.index, item=done))
        self.calls = {}
        return events

    def _open(self, item: dict[str, Any]) -> _OpenItem:
        open_item = _OpenItem(index=self.next_index, item=item)
        self.next_index += 1
        return open_item

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The events one chat completion chunk makes (none for a role-only or usage-only chunk)."""
        if isinstance(chunk.get("usage"), dict):
            prompt, completion = chunk["usage"].get("prompt_tokens"), chunk["usage"].get("completion_tokens")
            if is_token_count(prompt) and is_token_count(completion):
                self.usage, self.usage_details = Usage(prompt, completion), chunk["usage"]
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return []
        choice = choices[0]
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        delta = _object(choice.get("delta"))
        events: list[dict[str, Any]] = []
        reasoning = _reasoning_of(delta)
        if reasoning:
            if self.reasoning is None:
                events += self._close_message() + self._close_calls()
                self.reasoning = self._open(_reasoning_item(new_id("rs"), "", status="in_progress"))
                events.append(
                    self._event(
                        "response.output_item.added", output_index=self.reasoning.index, item=self.reasoning.item
                    )
                )
            self.reasoning.text.append(reasoning)
            events.append(
                self._event(
                    "response.reasoning_text.delta",
                    item_id=self.reasoning.item["id"],
                    output_index=self.reasoning.index,
                    content_index=0,
                    delta=reasoning,
                )
            )
        content = delta.get("content")
        if isinstance(content, str) and content:
            if self.message is None:
                events += self._close_reasoning() + self._close_calls()
                self.message = self._open(_message_item(new_id("msg"), "", status="in_progress"))
                index, item_id = self.message.index, self.message.item["id"]
                events.append(self._event("response.output_item.added", output_index=index, item=self.message.item))
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                events.append(
                    self._event(
                        "response.content_part.added", item_id=item_id, output_index=index, content_index=0, part=part
                    )
                )
            self.message.text.append(content)
            events.append(
                self._event(
                    "response.output_text.delta",
                    item_id=self.message.item["id"],
                    output_index=self.message.index,
                    content_index=0,
                    delta=content,
                    logprobs=[],
                )
            )
        for call in delta.get("tool_calls") or []:
            if not isinstance(call, dict):
                continue
            position = call.get("index", 0)
            function = _object(call.get("function"))
            open_item = self.calls.get(position)
            if open_item is None:
                events += self._close_reasoning() + self._close_message()
                # A new call after another: the earlier one is complete (chat streams calls one by one).
                events += self._close_calls()
                item = _call_item(
                    new_id("fc"),
                    str(call.get("id") or new_id("call")),
                    str(function.get("name") or ""),
                    "",
                    status="in_progress",
                )
                open_item = self.calls[position] = self._open(item)
                events.append(self._event("response.output_item.added", output_index=open_item.index, item=item))
            arguments = function.get("arguments")
            if isinstance(arguments, str) and arguments:
                open_item.text.append(arguments)
                events.append(
                    self._event(
                        "response.function_call_arguments.delta",
                        item_id=open_item.item["id"],
                        output_index=open_item.index,
                        delta=arguments,
                    )
                )
        return events

    def finish(self) -> list[dict[str, Any]]:
        """Close the open items and end with response.completed carrying usage."""
        events = self._close_reasoning() + self._close_message() + self._close_calls()
        assert self.usage is not None, "finish() needs the chat stream's usage"
        status = "incomplete" if self.finish_reason == "length" else "completed"
        usage = responses_usage(self.usage, self.usage_details)
        # Always response.completed, its response's status saying "incomplete" when the limit cut it (as vLLM
        # does): the SDK's stream helper (get_final_response) accepts no other final event.
        events.append(self._event("response.completed", response=self._response(status, usage)))
        return events
