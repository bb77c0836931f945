"""POST /v1/responses and POST /v1/rerank: the bodies' validation. Both then take the completions' path in
proxy/gateway.py (limits, select, reserve, forward, settle from the worker's usage, the same failures).

/v1/responses is stateless: `store: true` and `previous_response_id` are refused here, before anything is
looked up. Whether the rest can be translated to chat completions is judged once the workers are known
(proxy.upstream.select): a worker serving the Responses API itself takes the body as it is.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.payloads import _number, _positive_int, invalid, parse_body
from runtimes.request import RERANK, RESPONSES, CompletionParams

MAX_DOCUMENTS = 1024


def _strings(value: Any, into: list[str]) -> None:
    """Every string inside an input item (texts, call arguments and outputs): the prompt bound's share."""
    if isinstance(value, str):
        into.append(value)
    elif isinstance(value, list):
        for v in value:
            _strings(v, into)
    elif isinstance(value, dict):
        for v in value.values():
            _strings(v, into)


def parse_responses(raw: bytes) -> CompletionParams:
    """The body of POST /v1/responses, or a 400 naming the field."""
    body, model = parse_body(raw)
    if body.get("store") is True:
        raise invalid("'store' must be false or absent: this service keeps no responses (stateless)", "store")
    if body.get("previous_response_id") is not None:
        raise invalid(
            "'previous_response_id' is not supported: this service keeps no responses (stateless); "
            "send the conversation so far in 'input'",
            "previous_response_id",
        )
    if body.get("conversation") is not None:
        raise invalid("'conversation' is not supported: this service keeps no state (stateless)", "conversation")
    items = body.get("input")
    if not (isinstance(items, str) or (isinstance(items, list) and items)):
        raise invalid("'input' must be a string or a non-empty array of input items", "input")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise invalid("'instructions' must be a string", "instructions")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise invalid("'stream' must be a boolean", "stream")
    max_tokens = _positive_int(body, "max_output_tokens")
    _number(body, "temperature", 0, 2)
    _number(body, "top_p", 0, 1)
    texts: list[str] = [instructions] if instructions else []
    _strings(items, texts)
    for extra in ("tools", "text"):
        if body.get(extra) is not None:
            texts.append(orjson.dumps(body[extra]).decode())
    # Only counted (the bound's per-message allowance): the chat messages are made per worker.
    count = (len(items) if isinstance(items, list) else 1) + (1 if instructions else 0)
    messages: list[dict[str, Any]] = [{}] * count
    return CompletionParams(
        endpoint=RESPONSES,
        body=body,
        model=model,
        stream=stream,
        include_usage=True,
        max_tokens=max_tokens,
        texts=texts,
        messages=messages,
        prompt="",
    )


def parse_rerank(raw: bytes) -> CompletionParams:
    """The body of POST /v1/rerank ({"model", "query", "documents": [strings], "top_n"}), or a 400."""
    body, model = parse_body(raw)
    query = body.get("query")
    if not isinstance(query, str) or not query:
        raise invalid("'query' is required and must be a non-empty string", "query")
    documents = body.get("documents")
    if not isinstance(documents, list) or not documents or not all(isinstance(d, str) for d in documents):
        raise invalid("'documents' must be a non-empty array of strings", "documents")
    if len(documents) > MAX_DOCUMENTS:
        raise invalid(f"'documents' may hold at most {MAX_DOCUMENTS} strings", "documents")
    _positive_int(body, "top_n")
    return CompletionParams(
        endpoint=RERANK,
        body=body,
        model=model,
        stream=False,
        include_usage=False,
        max_tokens=None,
        texts=[query, *documents],
        messages=[],
        prompt="",
    )
