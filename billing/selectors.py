"""Reads for credits, the ledger and usage."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import QuerySet, Sum

from accounts.models import Account
from billing.models import LedgerEntry, UsageRecord
from catalog.models import PublicModel


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
