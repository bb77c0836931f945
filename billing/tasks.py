from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.conf import settings

from billing.idempotency import idempotency_purge
from billing.services import reservations_expire


@shared_task(name="billing.tasks.sweep_reservations")
def sweep_reservations(older_than_seconds: int | None = None) -> int:
    seconds = older_than_seconds if older_than_seconds is not None else settings.SPEEDINFER_RESERVATION_TTL
    idempotency_purge()  # keys past their 24 h replay window ride along with the sweep
    return reservations_expire(older_than=timedelta(seconds=seconds))
