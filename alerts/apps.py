from __future__ import annotations

from django.apps import AppConfig


class AlertsConfig(AppConfig):
    """Spend alerts: low balance and key budget crossings, by email to the owners and by signed webhook."""

    name = "alerts"
    default_auto_field = "django.db.models.BigAutoField"
