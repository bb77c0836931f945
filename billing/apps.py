from __future__ import annotations

from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db import connection

        from billing.ledger import choose

        choose(connection.vendor)  # once per process: billing.ledger's implementation for this database
