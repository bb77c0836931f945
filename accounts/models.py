from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from accounts.keys import KEY_PREFIX

SCOPES = ("chat", "completions", "embeddings", "models", "usage", "admin")
DEFAULT_SCOPES = ("chat", "completions", "embeddings", "models", "usage")


class Account(models.Model):
    """A customer: owns credits and API keys, and may have several dashboard users.

    Money is integer micro-credits (1 credit = 1,000,000). `available` and
    `reserved` change only through billing.services, each change with a ledger row.
    """

    name = models.CharField(max_length=200, unique=True)
    available = models.BigIntegerField(default=0)
    reserved = models.BigIntegerField(default=0)
    # Staff's ceilings on every key of the account: a key without its own limit inherits
    # the ceiling, a key above it is refused, and the rate limiter applies min(key, ceiling).
    rpm_ceiling = models.PositiveIntegerField(
        null=True, blank=True, verbose_name="RPM ceiling", help_text="Most requests per minute any key may have."
    )
    tpm_ceiling = models.PositiveIntegerField(
        null=True, blank=True, verbose_name="TPM ceiling", help_text="Most tokens per minute any key may have."
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=models.Q(reserved__gte=0), name="account_reserved_non_negative"),
            # The last line of defence behind the conditional UPDATEs: no path may overdraw an account.
            models.CheckConstraint(condition=models.Q(available__gte=0), name="account_available_non_negative"),
        ]

    def __str__(self) -> str:
        return self.name


class Role(models.TextChoices):
    OWNER = "owner", "Owner"
    DEVELOPER = "developer", "Developer"
    VIEWER = "viewer", "Viewer"


# What each role may do on the dashboard; the views name the power they need.
POWER_USAGE = "usage"  # the overview, usage, its CSV, the model list
POWER_KEYS = "keys"  # create and revoke API keys
POWER_BUDGETS = "budgets"  # set a key's monthly budget
POWER_MEMBERS = "members"  # invite, change roles, remove members
ROLE_POWERS: dict[str, frozenset[str]] = {
    Role.OWNER: frozenset({POWER_USAGE, POWER_KEYS, POWER_BUDGETS, POWER_MEMBERS}),
    Role.DEVELOPER: frozenset({POWER_USAGE, POWER_KEYS}),
    Role.VIEWER: frozenset({POWER_USAGE}),
}


class Membership(models.Model):
    """Links a dashboard user to the one account (team) they may see, with their role in it."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="membership")
    account = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "pk"]

    def __str__(self) -> str:
        return f"{self.user} @ {self.account} ({self.role})"

    def can(self, power: str) -> bool:
        return power in ROLE_POWERS.get(self.role, frozenset())

    @property
    def can_manage_keys(self) -> bool:
        return self.can(POWER_KEYS)

    @property
    def can_set_budgets(self) -> bool:
        return self.can(POWER_BUDGETS)

    @property
    def can_manage_members(self) -> bool:
        return self.can(POWER_MEMBERS)


class Invitation(models.Model):
    """An emailed invitation to join an account. The link is signed (django.core.signing) and carries
    a nonce whose digest is stored here; it expires at `expires_at` and is claimed once (`accepted_at`)."""

    account = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    nonce_digest = models.CharField(max_length=64, unique=True)
    invited_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.email} to {self.account} ({self.role})"

    @property
    def state(self) -> str:
        if self.accepted_at:
            return "accepted"
        if self.revoked_at:
            return "revoked"
        if self.expires_at <= timezone.now():
            return "expired"
        return "pending"


class ApiKey(models.Model):
    """An API key. Only the HMAC-SHA256 digest of the secret is stored."""

    account = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    lookup_id = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64)
    scopes = models.JSONField(default=list)
    allowed_models = models.JSONField(default=list, blank=True, help_text="Allowed public model ids; empty means all.")
    rpm = models.PositiveIntegerField(null=True, blank=True)
    tpm = models.PositiveIntegerField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    # Micro-credits the key may spend per calendar month (UTC); None means no cap.
    # Enforced by the reservation statement against billing.KeySpend.
    monthly_budget = models.BigIntegerField(null=True, blank=True, help_text="micro-credits per calendar month (UTC)")
    # Served first (high) or refused at once (low) while a model's workers are all at capacity (workers.queue).
    priority = models.CharField(
        max_length=6, choices=[("high", "high"), ("normal", "normal"), ("low", "low")], default="normal"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix})"

    @property
    def prefix(self) -> str:
        return f"{KEY_PREFIX}{self.lookup_id}"
