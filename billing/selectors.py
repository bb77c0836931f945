"""Reads for credits, the ledger and usage."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db.models import QuerySet, Sum

from accounts.models import Account
from billing.ledger import month_start
from billing.models import KeySpend, LedgerEntry, UsageRecord
from catalog.models import PublicModel
from core.credits import format_credits


@dataclass(frozen=True)
class LedgerTotals:
    available: int
    reserved: int


def ledger_totals(*, account: Account) -> LedgerTotals:
    """What the ledger says the balances are; equal to the account row when all is well."""
    sums = LedgerEntry.objects.filter(account=account).aggregate(a=Sum("available_delta"), r=Sum("reserved_delta"))
    return LedgerTotals(available=sums["a"] or 0, reserved=sums["r"] or 0)


def usage_for_account(*, account_id: int) -> QuerySet[UsageRecord]:
    return UsageRecord.objects.filter(account_id=account_id).order_by("-created_at", "-id")


def model_get(*, model_id: str) -> PublicModel | None:
    return PublicModel.objects.filter(model_id=model_id, enabled=True).first()


@dataclass(frozen=True)
class KeyMonth:
    """A key's money this calendar month (UTC), in micro-credits."""

    spent: int
    reserved: int
    resets_at: datetime


def _next_month(now: datetime) -> datetime:
    first = month_start(now)
    year, month = (first.year + 1, 1) if first.month == 12 else (first.year, first.month + 1)
    return datetime(year, month, 1, tzinfo=UTC)


def key_spend_this_month(*, api_key_ids: list[int], now: datetime | None = None) -> dict[int, KeyMonth]:
    """Spent and held this month per key (one query); keys with nothing this month are absent."""
    now = now or datetime.now(UTC)
    rows = KeySpend.objects.filter(api_key_id__in=api_key_ids, month=month_start(now))
    resets_at = _next_month(now)
    return {
        r.api_key_id: KeyMonth(spent=r.spent, reserved=r.reserved, resets_at=resets_at)
        for r in rows.only("api_key_id", "spent", "reserved")
    }


def key_budget_document(*, api_key_id: int, monthly_budget: int | None) -> dict[str, Any] | None:
    """GET /v1/key's `budget` (docs/interface.md): null, or {"limit", "spent", "resets_at"} with money as
    decimal strings."""
    if monthly_budget is None:
        return None
    now = datetime.now(UTC)
    month = key_spend_this_month(api_key_ids=[api_key_id], now=now).get(api_key_id)
    return {
        "limit": format_credits(monthly_budget),
        "spent": format_credits(month.spent if month else 0),
        "resets_at": _next_month(now).isoformat().replace("+00:00", "Z"),
    }
