from __future__ import annotations

from django.apps import AppConfig


class ProxyConfig(AppConfig):
    name = "proxy"
    default_auto_field = "django.db.models.BigAutoField"
