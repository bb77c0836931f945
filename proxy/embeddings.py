"""POST /v1/embeddings: the body's validation; the request then takes the completions' path in proxy/gateway.py
(authenticate with scope `embeddings`, limits, select, reserve the input's bound at the input price, forward,
settle from the worker's usage.prompt_tokens, the same failure path).
"""

from __future__ import annotations

import orjson

from proxy.payloads import MEDIA_PARTS, invalid, parse_body
from runtimes.request import EMBEDDINGS, CompletionParams

ENCODING_FORMATS = ("float", "base64")
MAX_INPUTS = 2048  # OpenAI's own limit on one request's inputs


def parse_embeddings(raw: bytes) -> CompletionParams:
    """The body of POST /v1/embeddings, or a 400 naming the field."""
    body, model = parse_body(raw)
    value = body.get("input")
    apart_bytes = apart_tokens = 0
    texts: list[str] = []
    if isinstance(value, str):
        texts = [value]
    elif isinstance(value, list) and value and all(isinstance(t, str) for t in value):
        texts = value
    elif isinstance(value, list) and value and isinstance(value[0], int | list):
        # Token ids: one prompt token each in the bound (docs/billing.md).
        batch = value if isinstance(value[0], list) else [value]
        for i, ids in enumerate(batch):
            param = f"input[{i}]" if batch is value else "input"
            if not isinstance(ids, list) or not ids:
                raise invalid(f"'{param}' must be a non-empty array of token ids", param)
            for j, token in enumerate(ids):
                if type(token) is not int or token < 0:
                    raise invalid(f"'{param}[{j}]' must be a token id (a non-negative integer)", f"{param}[{j}]")
            apart_tokens += len(ids)
        apart_bytes = len(orjson.dumps(value))
    else:
        for i, item in enumerate(value if isinstance(value, list) else []):
            if isinstance(item, dict) and item.get("type") in MEDIA_PARTS:
                raise invalid(f"'input[{i}]' is a media part: embeddings take text or token ids", f"input[{i}]")
        raise invalid(
            "'input' must be a string, a non-empty array of strings, an array of token ids "
            "or an array of arrays of token ids",
            "input",
        )
    inputs = len(value) if isinstance(value, list) and apart_tokens == 0 else 1
    if isinstance(value, list) and value and isinstance(value[0], list):
        inputs = len(value)
    if inputs > MAX_INPUTS:
        raise invalid(f"'input' may hold at most {MAX_INPUTS} inputs", "input")
    if any(not t for t in texts):
        raise invalid("'input' must not hold empty strings", "input")
    encoding = body.get("encoding_format")
    if encoding is not None and encoding not in ENCODING_FORMATS:
        raise invalid("'encoding_format' must be 'float' or 'base64'", "encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1):
        raise invalid("'dimensions' must be a positive integer", "dimensions")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise invalid("'user' must be a string", "user")
    return CompletionParams(
        endpoint=EMBEDDINGS,
        body=body,
        model=model,
        stream=False,
        include_usage=False,
        max_tokens=None,
        texts=texts,
        messages=[],
        prompt="",
        body_bytes=len(raw),
        apart_bytes=apart_bytes,
        apart_tokens=apart_tokens,
        needs={"prompt_arrays": "input"} if apart_tokens else {},
    )
