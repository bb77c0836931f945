from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone

from accounts.models import Account, ApiKey


class LedgerEntry(models.Model):
    """Append-only: every change to an account's available or reserved amount.

    Summing available_delta over an account's rows gives its available balance,
    and reserved_delta its reserved amount.
    """

    class Kind(models.TextChoices):
        GRANT = "grant"
        RESERVE = "reserve"
        SETTLE = "settle"
        RELEASE = "release"
        EXPIRE = "expire"

    account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="ledger")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    amount = models.BigIntegerField(help_text="micro-credits: granted, reserved, charged or released")
    available_delta = models.BigIntegerField()
    reserved_delta = models.BigIntegerField()
    available_after = models.BigIntegerField()
    reserved_after = models.BigIntegerField()
    reference = models.CharField(max_length=100, blank=True, help_text="reservation or request id")
    actor = models.CharField(max_length=150, blank=True, help_text="staff user, or 'gateway' / 'sweeper'")
    note = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "ledger entries"
        indexes = [models.Index(fields=["account", "-id"])]

    def __str__(self) -> str:
        return f"{self.kind} {self.amount} on {self.account_id}"


class Reservation(models.Model):
    """Credits held for one in-flight request until it is settled or released."""

    class Status(models.TextChoices):
        HELD = "held"
        SETTLED = "settled"
        RELEASED = "released"
        EXPIRED = "expired"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="reservations")
    api_key = models.ForeignKey(ApiKey, on_delete=models.SET_NULL, null=True, blank=True)
    model_id = models.CharField(max_length=200)
    amount = models.BigIntegerField()
    # Prices are fixed when the credits are held, so a price change mid-request
    # cannot make the settlement exceed what the customer was quoted.
    input_price = models.BigIntegerField(default=0)
    output_price = models.BigIntegerField(default=0)
    # The price of cached prompt tokens, fixed with the others (the input price when the model has none).
    cached_input_price = models.BigIntegerField(default=0, db_default=0)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.HELD)
    request_id = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    closed_at = models.DateTimeField(null=True, blank=True)
    # While its request runs the gateway keeps pushing this forward; the sweeper only expires a held
    # reservation whose lease has passed (null: one from before leases, judged by created_at alone).
    lease_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["created_at"], name="reservation_held_idx", condition=models.Q(status="held")),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.status}"


class UsageRecord(models.Model):
    """Append-only: one row per finished request, charged or not."""

    class Status(models.TextChoices):
        OK = "ok"
        FAILED = "failed"
        CLIENT_DISCONNECTED = "client_disconnected"

    account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="usage")
    api_key = models.ForeignKey(ApiKey, on_delete=models.SET_NULL, null=True, blank=True)
    reservation = models.OneToOneField(Reservation, on_delete=models.PROTECT, null=True, blank=True)
    request_id = models.CharField(max_length=100, blank=True, db_index=True)
    endpoint = models.CharField(max_length=32, blank=True)
    model_id = models.CharField(max_length=200)
    worker_id = models.CharField(max_length=200, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    # From the worker's usage.prompt_tokens_details / completion_tokens_details (0 when not reported).
    cached_tokens = models.PositiveIntegerField(default=0, db_default=0, help_text="prompt tokens served from cache")
    reasoning_tokens = models.PositiveIntegerField(
        default=0, db_default=0, help_text="completion tokens spent reasoning"
    )
    cost = models.BigIntegerField(default=0, help_text="micro-credits charged")
    reserved = models.BigIntegerField(default=0, help_text="micro-credits that were held")
    overrun = models.BigIntegerField(default=0, help_text="micro-credits the usage cost beyond the reservation")
    # A database default too: gateway processes still on the previous release keep inserting usage
    # rows without this column while a rolling deploy runs.
    uncharged = models.BigIntegerField(
        default=0,
        db_default=0,
        help_text="micro-credits of the usage's cost the account could not pay (never overdrawn)",
    )
    latency_ms = models.PositiveIntegerField(default=0)
    ttft_ms = models.PositiveIntegerField(null=True, blank=True)
    # Time it waited in the gateway for a capacity slot before it ran (workers.queue).
    queue_wait_ms = models.PositiveIntegerField(default=0, db_default=0)
    streamed = models.BooleanField(default=False)
    status = models.CharField(max_length=32, choices=Status.choices, default=Status.OK)
    error_code = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["account", "-created_at"]),
            models.Index(fields=["api_key", "-created_at"]),
            # Covers the dashboard's per-day / per-model sums: an index-only scan
            # over one account's date range, never the table (see README).
            models.Index(
                fields=["account", "created_at"],
                include=["model_id", "prompt_tokens", "completion_tokens", "cost", "status"],
                name="usage_account_day_cover",
            ),
            # Staff-wide aggregates and the admin's date filter.
            models.Index(fields=["created_at"], name="usage_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.request_id} {self.model_id} {self.status}"


class IdempotencyKey(models.Model):
    """One client's Idempotency-Key (docs/interface.md, HTTP): claimed by inserting this row, so of two identical
    requests at once exactly one runs; the answer it charged for is kept for replays (24 h)."""

    class State(models.TextChoices):
        RUNNING = "running"
        DONE = "done"

    api_key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    body_hash = models.CharField(max_length=64, help_text="sha256 of the request body")
    state = models.CharField(max_length=16, choices=State.choices, default=State.RUNNING)
    status = models.PositiveSmallIntegerField(default=0, help_text="the answer's HTTP status")
    streamed = models.BooleanField(default=False)
    body = models.BinaryField(default=b"", help_text="the answer as sent: JSON, or the SSE bytes")
    request_id = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["api_key", "key"], name="idempotency_key_unique_per_api_key")]

    def __str__(self) -> str:
        return f"{self.api_key_id} {self.key} {self.state}"


class KeySpend(models.Model):
    """One key's money in one calendar month (UTC): what was settled and what running requests hold.

    Every reservation made with a key adds to `reserved` in the same statement (or transaction) that
    holds the account's credits, refused when the key's monthly budget would be exceeded; settle,
    release and expiry move the hold to `spent` (the cost) or drop it. The row's lock serialises
    concurrent reservations on one key, so the budget is never exceeded.
    """

    api_key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, related_name="spend")
    month = models.DateField(help_text="the first day of the month (UTC)")
    spent = models.BigIntegerField(default=0, help_text="micro-credits settled this month")
    reserved = models.BigIntegerField(default=0, help_text="micro-credits held by running requests")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["api_key", "month"], name="keyspend_key_month")]

    def __str__(self) -> str:
        return f"{self.api_key_id} {self.month:%Y-%m}"
