"""Parsing and validating OpenAI request bodies (chat and legacy completions).

Only what the gateway must understand is checked: the fields that decide
billing, routing and streaming, and the common sampling fields' types and
ranges. Anything else passes through to OpenAI-compatible workers untouched,
because runtimes accept vendor fields (top_k, repetition_penalty, ...).
"""

from __future__ import annotations

from typing import Any

import orjson

from billing.pricing import PER_REQUEST_TOKEN_ALLOWANCE
from proxy.errors import GatewayError
from runtimes.request import CHAT, CompletionParams

# Content parts a runtime reads as media, not text: accepted only for a model registered with
# --media-tokens N, and reserved at N each (never by their base64 length).
MEDIA_PARTS = frozenset({"image_url", "input_audio", "video_url", "file"})
MAX_CHOICES = 16  # n and best_of
MAX_PROMPTS = 128  # /v1/completions prompts in one request

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


def _choices(body: dict[str, Any], name: str) -> int:
    # `true == 1` in Python, so a boolean must be refused before comparing.
    value = body.get(name)
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CHOICES:
        raise invalid(f"'{name}' must be an integer from 1 to {MAX_CHOICES}", name)
    return value


class _Apart:
    """What the prompt bound counts apart from the body's bytes (billing.pricing.prompt_token_bound)."""

    __slots__ = ("bytes", "tokens", "media", "media_param")

    def __init__(self) -> None:
        self.bytes = 0
        self.tokens = 0
        self.media = 0
        self.media_param = ""

    def add_media(self, part: dict[str, Any], param: str) -> None:
        self.bytes += len(orjson.dumps(part))
        self.media += 1
        self.media_param = self.media_param or param

    def add_token_ids(self, value: list[Any]) -> None:
        self.bytes += len(orjson.dumps(value))
        self.tokens += len(value)


def _token_ids(value: Any, param: str) -> bool:
    """Whether `value` is a non-empty array of token ids (non-negative integers); a 400 naming the
    field for an array of numbers that are not all such ids."""
    if not isinstance(value, list) or not value or isinstance(value[0], str | list | dict):
        return False
    for i, token in enumerate(value):
        if type(token) is not int or token < 0:
            raise invalid(f"'{param}[{i}]' must be a token id (a non-negative integer)", f"{param}[{i}]")
    return True


def _message_texts(messages: Any, apart: _Apart) -> list[str]:
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
                kind = part.get("type") if isinstance(part, dict) else None
                if kind in MEDIA_PARTS and isinstance(part, dict) and isinstance(part.get(kind), dict | str):
                    apart.add_media(part, f"{param}.content[{j}]")
                    continue
                if not isinstance(part, dict) or kind != "text" or not isinstance(part.get("text"), str):
                    raise invalid(
                        f"'{param}.content[{j}]' must be a text part or a media part "
                        f"({', '.join(sorted(MEDIA_PARTS))})",
                        f"{param}.content[{j}]",
                    )
                texts.append(part["text"])
        elif content is None:
            if role != "assistant":
                raise invalid(f"'{param}.content' is required", f"{param}.content")
        else:
            raise invalid(f"'{param}.content' must be a string or an array of content parts", f"{param}.content")
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

    apart = _Apart()
    messages: list[dict[str, Any]] = []
    prompt = ""
    prompts = 1
    if endpoint == CHAT:
        messages = body.get("messages")  # type: ignore[assignment]
        texts = _message_texts(messages, apart)
    else:
        texts, prompts = _prompts(body.get("prompt"), apart)
        prompt = texts[0] if len(texts) == 1 and prompts == 1 else ""
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
    n = _choices(body, "n")
    if endpoint == CHAT:
        _exactly_one(body, "best_of")
        best_of = 1
    else:
        best_of = _choices(body, "best_of")
        if body.get("best_of") is not None and best_of < n:
            raise invalid("'best_of' must be at least 'n'", "best_of")
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
        body_bytes=len(raw),
        apart_bytes=apart.bytes,
        # Each further prompt of a batch is a sequence of its own (its BOS, its template).
        apart_tokens=apart.tokens + (prompts - 1) * PER_REQUEST_TOKEN_ALLOWANCE,
        media_parts=apart.media,
        choices=max(n, best_of) * prompts,  # each prompt of a batch gets its own choices
        needs=_needs(
            body,
            n=n,
            best_of=best_of,
            media_param=apart.media_param,
            batch=endpoint != CHAT and (prompts > 1 or not texts),
        ),
        cache_key=cache_key or "",
    )


def _prompts(value: Any, apart: _Apart) -> tuple[list[str], int]:
    """/v1/completions `prompt`: a string, an array of strings, an array of token ids, or an array of
    arrays of token ids (up to MAX_PROMPTS). Its texts (for the disconnect estimate) and how many."""
    if isinstance(value, str):
        return [value], 1
    if _token_ids(value, "prompt"):
        apart.add_token_ids(value)
        return [], 1
    if not isinstance(value, list) or not value:
        raise invalid(
            "'prompt' must be a string, an array of strings, an array of token ids or an array of arrays of token ids",
            "prompt",
        )
    if len(value) > MAX_PROMPTS:
        raise invalid(f"'prompt' may hold at most {MAX_PROMPTS} prompts", "prompt")
    if all(isinstance(p, str) for p in value):
        return list(value), len(value)
    for i, ids in enumerate(value):
        if not _token_ids(ids, f"prompt[{i}]"):
            raise invalid(f"'prompt[{i}]' must be an array of token ids like the others", f"prompt[{i}]")
        apart.add_token_ids(ids)
    return [], len(value)


# What a request asks of its worker beyond plain text, by Capabilities flag: (flag, the field that asks it).
_FEATURE_FIELDS = (
    ("tools", "tools"),
    ("tools", "tool_choice"),
    ("tools", "functions"),
    ("response_format", "response_format"),
    ("logprobs", "logprobs"),
    ("logprobs", "top_logprobs"),
)


def _needs(body: dict[str, Any], *, n: int, best_of: int, media_param: str, batch: bool) -> dict[str, str]:
    """The Capabilities flags a worker must have to honour this request, each with the field asking it
    (docs/interface.md: silent drops are refused)."""
    needs: dict[str, str] = {}
    for flag, name in _FEATURE_FIELDS:
        value = body.get(name)
        if value is None or value is False or flag in needs:
            continue
        if name == "response_format" and value == {"type": "text"}:
            continue  # plain text, what every worker answers
        needs[flag] = name
    if n > 1 or best_of > 1:
        needs["n"] = "n" if n > 1 else "best_of"
    if media_param:
        needs["media"] = media_param
    if batch:
        needs["prompt_arrays"] = "prompt"
    return needs
