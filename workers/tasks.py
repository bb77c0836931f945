from __future__ import annotations

from celery import shared_task


@shared_task(name="workers.tasks.probe_all_workers")
def probe_all_workers() -> int:
    """Probe every enabled worker once; returns how many were probed. (Workers issue.)"""
    return 0
