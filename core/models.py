"""The ground's one table: the audit trail of staff changes."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class AuditLog(models.Model):
    """Append-only: one row per staff change to keys, credits, workers or prices.

    Written by core.audit.audit_record in the same transaction as the change
    when the caller has one open, so a rolled-back change leaves no row.
    """

    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.CharField(max_length=150, help_text="staff username, 'apikey:<prefix>' or a command name")
    action = models.CharField(max_length=64, db_index=True, help_text="e.g. key.create, credits.grant")
    target_type = models.CharField(max_length=64, blank=True)
    target_id = models.CharField(max_length=200, blank=True)
    target_repr = models.CharField("target", max_length=300, blank=True)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "audit log entry"
        verbose_name_plural = "audit log entries"
        # Moved from accounts: the table and its index keep their names (core/0001, accounts/0003).
        db_table = "accounts_auditlog"
        indexes = [models.Index(fields=["target_type", "target_id"], name="accounts_au_target__0c7dca_idx")]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M} {self.actor} {self.action} {self.target_repr}"
