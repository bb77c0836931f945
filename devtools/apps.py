from __future__ import annotations

from django.apps import AppConfig


class DevtoolsConfig(AppConfig):
    """Demo and test tools (the worker simulator, a local Triton, the demo's seeding): no product code imports it."""

    name = "devtools"
