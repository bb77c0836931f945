"""Parsing and validating OpenAI request bodies (chat and legacy completions).

Only what the gateway must understand is checked: the fields that decide
billing, routing and streaming, and the common sampling fields' types and
ranges. Anything else passes through to OpenAI-compatible workers untouched,
because runtimes accept vendor fields (top_k, repetition_penalty, ...).
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.errors import GatewayError
from runtimes.request import CHAT, CompletionParams

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
# orjson parses 1024 levels of nesting but serialises only 254, and the body is
# serialised again on its way to the worker; no real request nests this deep.
MAX_JSON_DEPTH = 64


def invalid(message: str, param: str | None) -> GatewayError:
    return GatewayError(400, "invalid_request", message, param=param)


def _number(body: dict[str, Any], name: str, low: float, high: float) -> None:
    value = body.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid(f"'{name}' must be a number", name)
    if not low <= value <= high:
        raise invalid(f"'{name}' must be between {low:g} and {high:g}", name)


def _positive_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"'{name}' must be an integer", name)
    if value < 1:
        raise invalid(f"'{name}' must be at least 1", name)
    return value


def _too_deep(raw: bytes, body: Any) -> bool:
    """Whether `body` nests more than MAX_JSON_DEPTH arrays/objects.

    Counting brackets in the raw bytes is C speed and rules out almost every
    body; only one with that many brackets is walked.
    """
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return False
    level: list[Any] = [body]
    for _ in range(MAX_JSON_DEPTH):
        children: list[Any] = []
        for node in level:
            if isinstance(node, dict):
                children.extend(v for v in node.values() if isinstance(v, dict | list))
            elif isinstance(node, list):
                children.extend(v for v in node if isinstance(v, dict | list))
        if not children:
            return False
        level = children
    return True


def refuse_deep_nesting(raw: bytes, body: Any) -> None:
    """400 for a body nested deeper than MAX_JSON_DEPTH (any /v1 body, before it is forwarded)."""
    if _too_deep(raw, body):
        raise invalid(f"the request body nests more than {MAX_JSON_DEPTH} levels of arrays and objects", None)


def _exactly_one(body: dict[str, Any], name: str) -> None:
    # `true == 1` in Python, so a boolean must be refused before comparing.
    value = body.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value != 1):
        raise invalid(f"'{name}' must be 1: one choice per request", name)


def _message_texts(messages: Any) -> list[str]:
    if not isinstance(messages, list) or not messages:
        raise invalid("'messages' must be a non-empty array", "messages")
    texts: list[str] = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise invalid(f"'{param}' must be an object", param)
        role = message.get("role")
        if role not in _ROLES:
            raise invalid(f"'{param}.role' must be one of {', '.join(sorted(_ROLES))}", f"{param}.role")
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise invalid(f"'{param}.content[{j}]' must be a text part", f"{param}.content")
                texts.append(part["text"])
        elif content is None:
            if role != "assistant":
                raise invalid(f"'{param}.content' is required", f"{param}.content")
        else:
            raise invalid(f"'{param}.content' must be a string or an array of text parts", f"{param}.content")
        for extra in ("name", "tool_calls", "function_call", "tool_call_id"):
            if message.get(extra) is not None:
                value = message[extra]
                texts.append(value if isinstance(value, str) else orjson.dumps(value).decode())
    return texts


def parse_body(raw: bytes) -> tuple[dict[str, Any], str]:
    """A /v1 POST body as a JSON object, and its required `model`; or a 400 naming the field."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise invalid("the request body is not valid JSON", None) from None
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object", None)
    refuse_deep_nesting(raw, body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("'model' is required and must be a string", "model")
    return body, model


def parse_completion(raw: bytes, *, endpoint: str) -> CompletionParams:
    """The body of POST /v1/chat/completions or /v1/completions, or a 400 naming the field."""
    body, model = parse_body(raw)

    messages: list[dict[str, Any]] = []
    prompt = ""
    if endpoint == CHAT:
        messages = body.get("messages")  # type: ignore[assignment]
        texts = _message_texts(messages)
        # Tool and format definitions are part of what the runtime reads as prompt.
        for extra in ("tools", "functions", "response_format"):
            if body.get(extra) is not None:
                texts.append(orjson.dumps(body[extra]).decode())
    else:
        value = body.get("prompt")
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
            value = value[0]
        if not isinstance(value, str):
            raise invalid("'prompt' must be a string (one prompt per request)", "prompt")
        prompt = value
        texts = [prompt]
        if body.get("suffix") is not None:
            if not isinstance(body["suffix"], str):
                raise invalid("'suffix' must be a string", "suffix")
            texts.append(body["suffix"])

    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise invalid("'stream' must be a boolean", "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise invalid("'stream_options' must be an object", "stream_options")
        include_usage = options.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise invalid("'stream_options.include_usage' must be a boolean", "stream_options.include_usage")

    max_tokens = _positive_int(body, "max_tokens")
    if endpoint == CHAT:
        newer = _positive_int(body, "max_completion_tokens")
        if newer is not None:
            max_tokens = newer
    _exactly_one(body, "n")
    _exactly_one(body, "best_of")
    _number(body, "temperature", 0, 2)
    _number(body, "top_p", 0, 1)
    _number(body, "presence_penalty", -2, 2)
    _number(body, "frequency_penalty", -2, 2)
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str):
        if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) for s in stop):
            raise invalid("'stop' must be a string or an array of up to 4 strings", "stop")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise invalid("'user' must be a string", "user")
    cache_key = body.get("prompt_cache_key")
    if cache_key is not None and not isinstance(cache_key, str):
        raise invalid("'prompt_cache_key' must be a string", "prompt_cache_key")
    return CompletionParams(
        endpoint=endpoint,
        body=body,
        model=model,
        stream=stream,
        include_usage=include_usage,
        max_tokens=max_tokens,
        texts=texts,
        messages=messages,
        prompt=prompt,
        cache_key=cache_key or "",
    )
