"""Costs and reservation bounds, in integer micro-credits."""

from __future__ import annotations

TOKENS_PER_PRICE_UNIT = 1_000_000
# Upper bound of tokens a chat message adds beyond its text (role, separators);
# OpenAI documents 3-4 per message, TRT-LLM chat templates a few more.
PER_MESSAGE_TOKEN_ALLOWANCE = 16
PER_REQUEST_TOKEN_ALLOWANCE = 16


def cost_of(
    *,
    prompt_tokens: int,
    completion_tokens: int,
    input_price: int,
    output_price: int,
    cached_tokens: int = 0,
    cached_input_price: int = 0,
) -> int:
    """Cost in micro-credits, rounded up to the next micro-credit: (prompt - cached) x input +
    cached x cached input + completion x output (the PostgreSQL ledger's statement computes the same)."""
    numerator = (
        (prompt_tokens - cached_tokens) * input_price
        + cached_tokens * cached_input_price
        + completion_tokens * output_price
    )
    return -(-numerator // TOKENS_PER_PRICE_UNIT)


def prompt_token_bound(
    *,
    body_bytes: int,
    messages: int,
    apart_bytes: int = 0,
    apart_tokens: int = 0,
    media_parts: int = 0,
    media_tokens: int = 0,
) -> int:
    """An upper bound of the prompt tokens a worker may bill for a request (docs/billing.md, "The bound").

    Every string a runtime may read as prompt is inside the body, and a JSON string takes at least as
    many bytes as its UTF-8 text; a byte-level tokenizer emits at most one token per byte. So the
    body's size bounds its text's tokens whatever fields it carries (vLLM's `documents`,
    `chat_template_kwargs`, ...), at no cost: no walk, no serialisation. What is counted apart is
    taken off: `apart_bytes` is the compact JSON size of token-id prompts (counted one token per id,
    `apart_tokens`) and of media parts (counted at the model's `media_tokens` each); compact JSON is
    never longer than the client's own encoding of the same value, so the rest still covers the body.
    """
    text = max(0, body_bytes - apart_bytes)
    return (
        text
        + apart_tokens
        + media_parts * media_tokens
        + messages * PER_MESSAGE_TOKEN_ALLOWANCE
        + PER_REQUEST_TOKEN_ALLOWANCE
    )
