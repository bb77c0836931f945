from __future__ import annotations

from celery import shared_task

from workers.selectors import workers_enabled
from workers.services import workers_probe


@shared_task(name="workers.tasks.probe_all_workers")
def probe_all_workers() -> int:
    """Probe every enabled worker once, concurrently; returns how many were probed."""
    return len(workers_probe(workers=workers_enabled()))
