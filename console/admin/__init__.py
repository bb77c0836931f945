"""The Django admin for staff: one module per app's models (Django's autodiscovery imports this package)."""

from __future__ import annotations

from django.contrib import admin

from console.admin import accounts, alerts, billing, workers

admin.site.site_header = "SpeedInfer administration"
admin.site.site_title = "SpeedInfer admin"
admin.site.index_title = "Workers, models, accounts and money"
admin.site.site_url = "/"  # the landing page

__all__ = ["accounts", "alerts", "billing", "workers"]
