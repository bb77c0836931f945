"""Costs and reservation bounds, in integer micro-credits."""

from __future__ import annotations

TOKENS_PER_PRICE_UNIT = 1_000_000
# Upper bound of tokens a chat message adds beyond its text (role, separators);
# OpenAI documents 3-4 per message, TRT-LLM chat templates a few more.
PER_MESSAGE_TOKEN_ALLOWANCE = 16
PER_REQUEST_TOKEN_ALLOWANCE = 16


def cost_of(*, prompt_tokens: int, completion_tokens: int, input_price: int, output_price: int) -> int:
    """Cost in micro-credits, rounded up to the next micro-credit."""
    numerator = prompt_tokens * input_price + completion_tokens * output_price
    return -(-numerator // TOKENS_PER_PRICE_UNIT)


def prompt_token_bound(*, texts: list[str], messages: int) -> int:
    """An upper bound of prompt tokens: no tokenizer emits more tokens than UTF-8 bytes."""
    return sum(len(t.encode()) for t in texts) + messages * PER_MESSAGE_TOKEN_ALLOWANCE + PER_REQUEST_TOKEN_ALLOWANCE
