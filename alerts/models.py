"""Spend alerts: an account's settings, the crossings already alerted, the events and their deliveries.

Events are append-only (a retry resends the same event, same `id`); a delivery row carries the state of
one channel's attempts at one event.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone

from accounts.models import Account, ApiKey


def new_event_id() -> str:
    return f"evt_{uuid.uuid4().hex}"


class AlertSettings(models.Model):
    """One account's alert configuration and its low-balance crossing state."""

    account = models.OneToOneField(Account, on_delete=models.CASCADE, primary_key=True, related_name="alert_settings")
    low_balance = models.BigIntegerField(
        null=True, blank=True, help_text="micro-credits; alert when available falls below it (None: off)"
    )
    # True once a balance.low event went out for the current dip; cleared when available is back at
    # or above the threshold (re-armed), so one crossing is one alert however many requests follow.
    balance_below = models.BooleanField(default=False)
    webhook_url = models.URLField(max_length=500, blank=True)
    # Kept as is: the sender needs it to sign. Shown to the customer once, when it is made.
    webhook_secret = models.CharField(max_length=80, blank=True)
    budget_percents = models.JSONField(default=list, blank=True, help_text="percentages of each key's monthly budget")
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "alert settings"
        verbose_name_plural = "alert settings"

    def __str__(self) -> str:
        return f"alerts for {self.account}"


class KeyBudgetCrossing(models.Model):
    """A key's spend crossed `percent` of its budget in `month`: alerted once, never again that month."""

    api_key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, related_name="budget_crossings")
    month = models.DateField(help_text="the first day of the month (UTC)")
    percent = models.PositiveIntegerField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["api_key", "month", "percent"], name="keybudgetcrossing_once"),
        ]

    def __str__(self) -> str:
        return f"{self.api_key_id} {self.month:%Y-%m} {self.percent}%"


class AlertEvent(models.Model):
    class Type(models.TextChoices):
        BALANCE_LOW = "balance.low"
        KEY_BUDGET = "key.budget"

    id = models.CharField(max_length=40, primary_key=True, default=new_event_id, editable=False)
    type = models.CharField(max_length=32, choices=Type.choices)
    account = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="alert_events")
    data = models.JSONField(default=dict)
    created = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.type} {self.id}"


class AlertDelivery(models.Model):
    class Channel(models.TextChoices):
        EMAIL = "email"
        WEBHOOK = "webhook"

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"

    event = models.ForeignKey(AlertEvent, on_delete=models.CASCADE, related_name="deliveries")
    channel = models.CharField(max_length=16, choices=Channel.choices)
    target = models.CharField(max_length=500, help_text="the email address or the webhook URL")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    first_attempt_at = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "alert deliveries"
        indexes = [
            models.Index(fields=["next_attempt_at"], name="alertdelivery_due_idx", condition=models.Q(status="pending"))
        ]

    def __str__(self) -> str:
        return f"{self.channel} {self.event_id}"
