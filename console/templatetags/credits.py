"""`{{ micro|credits }}`: integer micro-credits as a decimal string of credits."""

from __future__ import annotations

from datetime import datetime, timedelta

from django import template
from django.utils import timezone
from django.utils.timesince import timesince

from core.credits import display_credits, format_credits

register = template.Library()


@register.filter
def credits(micro: int | None) -> str:
    return format_credits(micro or 0)


@register.filter
def credits_short(micro: int | None) -> str:
    """Credits as every page shows them (core.credits.display_credits): a small spend stays visible."""
    return display_credits(micro or 0)


@register.filter
def ago(moment: datetime | None) -> str:
    """ "just now" under a minute, else "5 minutes ago" (Django's timesince says "0 minutes")."""
    if moment is None:
        return ""
    if timezone.now() - moment < timedelta(minutes=1):
        return "just now"
    return f"{timesince(moment)} ago"
