"""Credits at the edges: micro-credits (the integer every balance and price is kept in) to and from decimal strings.

The one rule for showing an amount:
- for machines (the /v1 and staff APIs, CSV exports, commands' output): `format_credits`, always
  exactly six decimals ("0.000010", "12.500000"), so a parser never meets two shapes;
- for people (dashboard, admin, messages): `display_credits`, thousands grouped, trailing zeros
  trimmed to at least two decimals, at most six ("0.00001", "12.50", "1,234.00"), with the exact
  six-decimal figure in the element's title where space allows.
Token and request counts on pages are grouped by thousands (`{{ n|tokens }}`).
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

MICRO = 1_000_000  # micro-credits per credit


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


def display_credits(micro: int) -> str:
    """Credits for people: thousands grouped, at least 2 and at most 6 decimals, so that a spend
    of 0.000502 reads as such and 10 reads "10.00". The one way every page shows credits."""
    text = f"{Decimal(format_credits(micro)):,.6f}"
    whole, _, decimals = text.partition(".")
    return f"{whole}.{decimals.rstrip('0').ljust(2, '0')}"
