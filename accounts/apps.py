from __future__ import annotations

from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from accounts.live import usage_push
        from billing.services import usage_listeners

        if usage_push not in usage_listeners:
            usage_listeners.append(usage_push)
