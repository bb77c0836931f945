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

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Count, F, QuerySet, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from accounts.models import Account, ApiKey, Membership
from billing.models import UsageRecord


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


def usage_records_iter(*, account: Account, start: date, end: date) -> Iterator[UsageRecord]:
    """For CSV export: streamed from a server-side cursor, never all in memory."""
    return usage_records(account=account, start=start, end=end).iterator(chunk_size=2000)


def api_keys_owned(*, account: Account) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(account=account).order_by(F("revoked_at").asc(nulls_first=True), "-created_at")
