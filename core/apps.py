from __future__ import annotations

from django.apps import AppConfig


class CoreConfig(AppConfig):
    """The ground every app stands on; an app only for its audit table."""

    name = "core"
    verbose_name = "Audit"
    default_auto_field = "django.db.models.BigAutoField"
