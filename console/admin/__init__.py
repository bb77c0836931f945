"""The Django admin for staff: one module per app's models (Django's autodiscovery imports this package)."""

from __future__ import annotations

from console.admin import accounts, billing, workers

__all__ = ["accounts", "billing", "workers"]
