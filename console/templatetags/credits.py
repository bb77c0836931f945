"""`{{ micro|credits }}`: integer micro-credits as a decimal string of credits."""

from __future__ import annotations

from decimal import Decimal

from django import template

from core.credits import format_credits

register = template.Library()


@register.filter
def credits(micro: int | None) -> str:
    return format_credits(micro or 0)


@register.filter
def credits_short(micro: int | None) -> str:
    """Two decimals for headline numbers; the exact value is in the title attribute."""
    return f"{Decimal(format_credits(micro or 0)):,.2f}"
