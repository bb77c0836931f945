from __future__ import annotations

from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """What people see: the customer dashboard and its live feed, the staff API and the admin."""

    name = "console"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from billing.services import usage_listeners
        from console.live import usage_push

        if usage_push not in usage_listeners:
            usage_listeners.append(usage_push)
