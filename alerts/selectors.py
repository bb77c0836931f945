"""Reads for spend alerts."""

from __future__ import annotations

from django.db.models import QuerySet

from accounts.models import Account
from alerts.models import AlertDelivery, AlertSettings


def alert_settings_for(*, account: Account) -> AlertSettings | None:
    return AlertSettings.objects.filter(account=account).first()


def alert_deliveries_for(*, account: Account, limit: int = 20) -> QuerySet[AlertDelivery]:
    return (
        AlertDelivery.objects.filter(event__account=account)
        .select_related("event")
        .order_by("-created_at", "-id")[:limit]
    )
