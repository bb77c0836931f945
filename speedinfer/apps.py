from __future__ import annotations

from django.apps import AppConfig


class SpeedinferConfig(AppConfig):
    """The wiring; an app only so that `manage.py runschedule` (the schedule, beside celery beat's) is found."""

    name = "speedinfer"
