"""Reads behind the customer dashboard. Every query is scoped to one account.

The sums use date-truncated aggregates over the covering index
`usage_account_day_cover` (account, created_at) INCLUDE (model_id, tokens, cost,
status), so PostgreSQL answers them with an index-only scan of the account's
date range; see tests/test_dashboard_scale.py for timings on a million rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Count, F, QuerySet, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from accounts.models import Account, ApiKey, Membership
from billing.models import UsageRecord
from billing.selectors import key_spend_this_month
from catalog.models import PublicModel
from core.credits import display_credits, format_credits
from core.refusals import RefusalCount, refusal_counts
from workers.selectors import workers_enabled


@dataclass(frozen=True)
class Summary:
    available: int
    reserved: int
    spend_month: int
    requests_today: int
    tokens_today: int


@dataclass(frozen=True)
class DayModelUsage:
    day: date
    model_id: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cost: int

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def account_for_user(*, user: AbstractBaseUser | AnonymousUser) -> Account | None:
    if not user.is_authenticated:
        return None
    membership = Membership.objects.select_related("account").filter(user_id=user.pk).first()
    return membership.account if membership else None


def _day_start(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=timezone.get_current_timezone())


def dashboard_summary(*, account: Account, now: datetime | None = None) -> Summary:
    now = now or timezone.localtime()
    today = _day_start(now.date())
    month = _day_start(now.date().replace(day=1))
    rows = UsageRecord.objects.filter(account_id=account.pk)
    spend = rows.filter(created_at__gte=month).aggregate(cost=Sum("cost"))["cost"] or 0
    day = rows.filter(created_at__gte=today).aggregate(
        requests=Count("*"), prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens")
    )
    fresh = Account.objects.values_list("available", "reserved").get(pk=account.pk)
    return Summary(
        available=fresh[0],
        reserved=fresh[1],
        spend_month=spend,
        requests_today=day["requests"] or 0,
        tokens_today=(day["prompt"] or 0) + (day["completion"] or 0),
    )


def usage_by_day_and_model(*, account: Account, start: date, end: date) -> list[DayModelUsage]:
    """Sums per (UTC day, model) for start..end inclusive, ordered by day then model."""
    rows = (
        UsageRecord.objects.filter(
            account_id=account.pk, created_at__gte=_day_start(start), created_at__lt=_day_start(end + timedelta(1))
        )
        .annotate(day=TruncDate("created_at"))
        .values("day", "model_id")
        .annotate(
            requests=Count("*"),
            prompt_tokens=Sum("prompt_tokens"),
            completion_tokens=Sum("completion_tokens"),
            cost=Sum("cost"),
        )
        .order_by("day", "model_id")
    )
    return [
        DayModelUsage(
            day=row["day"],
            model_id=row["model_id"],
            requests=row["requests"],
            prompt_tokens=row["prompt_tokens"] or 0,
            completion_tokens=row["completion_tokens"] or 0,
            cost=row["cost"] or 0,
        )
        for row in rows
    ]


def usage_records(*, account: Account, start: date | None = None, end: date | None = None) -> QuerySet[UsageRecord]:
    """The account's usage records, newest first, optionally within start..end inclusive."""
    rows = UsageRecord.objects.filter(account_id=account.pk)
    if start is not None:
        rows = rows.filter(created_at__gte=_day_start(start))
    if end is not None:
        rows = rows.filter(created_at__lt=_day_start(end + timedelta(1)))
    return rows.select_related("api_key").order_by("-created_at", "-id")


def refused_requests(*, account: Account, start: date, end: date) -> list[RefusalCount]:
    """Requests the gateway refused (no usage record: nothing was charged), per error code."""
    return refusal_counts(account_id=account.pk, start=start, end=end)


def usage_records_iter(*, account: Account, start: date, end: date) -> Iterator[UsageRecord]:
    """For CSV export: streamed from a server-side cursor, never all in memory."""
    return usage_records(account=account, start=start, end=end).iterator(chunk_size=2000)


def api_keys_owned(*, account: Account) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(account=account).order_by(F("revoked_at").asc(nulls_first=True), "-created_at")


@dataclass(frozen=True)
class KeyRow:
    """A key as the keys page lists it, with its money this month (micro-credits)."""

    key: ApiKey
    state: str  # "active", "revoked" or "expired"
    spent: int
    held: int


def api_keys_with_spend(*, account: Account) -> list[KeyRow]:
    """The account's keys, newest first, each with what it spent and holds this month (two queries)."""
    keys = list(api_keys_owned(account=account))
    month = key_spend_this_month(api_key_ids=[k.pk for k in keys])
    now = timezone.now()
    rows = []
    for key in keys:
        state = "revoked" if key.revoked_at else "expired" if key.expires_at and key.expires_at <= now else "active"
        spend = month.get(key.pk)
        rows.append(
            KeyRow(key=key, state=state, spent=spend.spent if spend else 0, held=spend.reserved if spend else 0)
        )
    return rows


@dataclass(frozen=True)
class ModelRow:
    model_id: str
    input_price: int  # micro-credits per 1M tokens
    output_price: int
    max_output_tokens: int
    up: bool


def models_for_customers() -> list[ModelRow]:
    """Enabled public models with prices and whether some healthy worker has them ready (two queries)."""
    ready: set[str] = set()
    for worker in workers_enabled().filter(healthy=True).only("supported_models", "model_readiness"):
        readiness = worker.model_readiness or {}
        ready.update(m for m in worker.supported_models if readiness.get(m))
    return [
        ModelRow(
            model_id=m.model_id,
            input_price=m.input_price,
            output_price=m.output_price,
            max_output_tokens=m.max_output_tokens,
            up=m.model_id in ready,
        )
        for m in PublicModel.objects.filter(enabled=True).order_by("model_id")
    ]


def summary_event(*, account_id: int) -> dict[str, Any]:
    """The overview cards as the live feed sends them: the same figures and formatting as the page."""
    summary = dashboard_summary(account=Account.objects.get(pk=account_id))
    return {
        "available": display_credits(summary.available),
        "available_exact": format_credits(summary.available),
        "reserved": display_credits(summary.reserved),
        "reserved_exact": format_credits(summary.reserved),
        "spend_month": display_credits(summary.spend_month),
        "spend_month_exact": format_credits(summary.spend_month),
        "requests_today": summary.requests_today,
        "tokens_today": summary.tokens_today,
    }
