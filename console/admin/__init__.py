"""The Django admin for staff: one module per app's models (Django's autodiscovery imports this package)."""

from __future__ import annotations

from django.contrib import admin

from console.admin import accounts, alerts, billing, workers

admin.site.site_header = "SpeedInfer administration"
admin.site.site_title = "SpeedInfer admin"
admin.site.index_title = "Workers, models, accounts and money"
admin.site.site_url = "/"  # the landing page
# The app list is one click away on the index: a permanent sidebar takes a third of a 1280 px screen
# from every list (the wide tables: keys, workers, usage, reservations, the audit log).
admin.site.enable_nav_sidebar = False

__all__ = ["accounts", "alerts", "billing", "workers"]
