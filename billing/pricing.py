"""Prices, costs and reservation bounds, in integer micro-credits."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from billing.models import MICRO

TOKENS_PER_PRICE_UNIT = 1_000_000
# Upper bound of tokens a chat message adds beyond its text (role, separators);
# OpenAI documents 3-4 per message, TRT-LLM chat templates a few more.
PER_MESSAGE_TOKEN_ALLOWANCE = 16
PER_REQUEST_TOKEN_ALLOWANCE = 16


class AmountError(ValueError):
    pass


def parse_credits(text: str, *, field: str = "amount", allow_negative: bool = False) -> int:
    """A decimal string of credits (at most 6 decimals) to micro-credits."""
    try:
        value = Decimal(text.strip())
    except (InvalidOperation, AttributeError):
        raise AmountError(f"{field}: not a decimal number: {text!r}") from None
    if not value.is_finite():
        raise AmountError(f"{field}: not a finite number: {text!r}")
    micro = value * MICRO
    if micro != micro.to_integral_value():
        raise AmountError(f"{field}: at most 6 decimal places: {text!r}")
    if micro < 0 and not allow_negative:
        raise AmountError(f"{field}: must not be negative: {text!r}")
    if abs(micro) >= 10**18:
        raise AmountError(f"{field}: too large: {text!r}")
    return int(micro)


def format_credits(micro: int) -> str:
    """Micro-credits as a decimal string of credits with six decimals."""
    return str((Decimal(micro) / MICRO).quantize(Decimal("0.000001"), rounding=ROUND_HALF_UP))


def cost_of(*, prompt_tokens: int, completion_tokens: int, input_price: int, output_price: int) -> int:
    """Cost in micro-credits, rounded up to the next micro-credit."""
    numerator = prompt_tokens * input_price + completion_tokens * output_price
    return -(-numerator // TOKENS_PER_PRICE_UNIT)


def prompt_token_bound(*, texts: list[str], messages: int) -> int:
    """An upper bound of prompt tokens: no tokenizer emits more tokens than UTF-8 bytes."""
    return sum(len(t.encode()) for t in texts) + messages * PER_MESSAGE_TOKEN_ALLOWANCE + PER_REQUEST_TOKEN_ALLOWANCE
