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
def tokens(count: int | None) -> str:
    """A token count with thousands separators (1,234,567), the one way every page shows one."""
    return f"{count or 0:,}"


@register.filter
def duration_words(span: timedelta | None) -> str:
    """A wait as people say it: "15 minutes", "1 hour", "30 seconds" (never ISO 8601's "PT15M")."""
    if span is None:
        return ""
    seconds = max(round(span.total_seconds()), 1)
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0 or seconds >= size * 2:
            count = round(seconds / size)
            return f"{count} {unit}{'' if count == 1 else 's'}"
    return f"{seconds} second{'' if seconds == 1 else 's'}"


@register.filter
def ago(moment: datetime | None) -> str:
    """ "just now" under a minute, else "5 minutes ago" (Django's timesince says "0 minutes")."""
    if moment is None:
        return ""
    if timezone.now() - moment < timedelta(minutes=1):
        return "just now"
    return f"{timesince(moment)} ago"
