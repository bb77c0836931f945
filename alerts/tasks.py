from __future__ import annotations

from celery import shared_task

from alerts.services import alerts_send


@shared_task(name="alerts.tasks.send_alerts")
def send_alerts() -> int:
    """The schedule's alert run (manage.py sendalerts does the same once); returns the events raised."""
    return alerts_send().raised
