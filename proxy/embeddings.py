"""POST /v1/embeddings: the body's validation; the request then takes the completions' path in proxy/gateway.py
(authenticate with scope `embeddings`, limits, select, reserve the input's bound at the input price, forward,
settle from the worker's usage.prompt_tokens, the same failure path).
"""

from __future__ import annotations

from proxy.payloads import invalid, parse_body
from runtimes.request import EMBEDDINGS, CompletionParams

ENCODING_FORMATS = ("float", "base64")
MAX_INPUTS = 2048  # OpenAI's own limit on one request's inputs


def parse_embeddings(raw: bytes) -> CompletionParams:
    """The body of POST /v1/embeddings, or a 400 naming the field."""
    body, model = parse_body(raw)
    value = body.get("input")
    texts = [value] if isinstance(value, str) else value
    # Token-array inputs would need the worker's tokenizer to bound the reservation: refused.
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise invalid("'input' must be a string or a non-empty array of strings", "input")
    if len(texts) > MAX_INPUTS:
        raise invalid(f"'input' may hold at most {MAX_INPUTS} strings", "input")
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
    )
