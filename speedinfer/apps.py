from __future__ import annotations

from typing import Any

from django.apps import AppConfig


def _settings_changed(**_: Any) -> None:
    from core import state

    state.reset_config()  # a test overrode a setting: the config objects are rebuilt from it on next use


class SpeedinferConfig(AppConfig):
    """The wiring: builds the layers' config objects from settings at start-up (a bad value is an
    ImproperlyConfigured here, not at the first request); an app also so that `manage.py
    runschedule` (the schedule, beside celery beat's) is found."""

    name = "speedinfer"

    def ready(self) -> None:
        from django.test.signals import setting_changed

        from accounts.key_cache import cache_policy as key_cache_policy
        from catalog.cache import cache_policy as model_cache_policy
        from proxy.ratelimit import get_rate_limit_config
        from runtimes.config import get_runtime_config
        from workers.config import get_routing_config

        builds = (get_runtime_config, get_routing_config, get_rate_limit_config, key_cache_policy, model_cache_policy)
        for build in builds:
            build()
        setting_changed.connect(_settings_changed, dispatch_uid="speedinfer.state.reset_config")
