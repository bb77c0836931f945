from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from django.conf import settings

from alerts.tasks import send_alerts
from billing.tasks import sweep_reservations
from core.commands import SpeedInferCommand
from workers.tasks import probe_all_workers

log = logging.getLogger("speedinfer.schedule")


class Command(SpeedInferCommand):
    help = (
        "Run the Celery beat schedule's tasks in this process, with no broker: worker probes every "
        "SPEEDINFER_PROBE_INTERVAL seconds, the reservation sweep every SPEEDINFER_SWEEP_INTERVAL and spend "
        "alerts every SPEEDINFER_ALERTS_INTERVAL. "
        "For the embedded default; production runs `celery -A speedinfer worker --beat` instead."
    )

    def run(self, *args: Any, **options: Any) -> None:
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        jobs = [
            (probe_all_workers, settings.SPEEDINFER_PROBE_INTERVAL),
            (sweep_reservations, settings.SPEEDINFER_SWEEP_INTERVAL),
            (send_alerts, settings.SPEEDINFER_ALERTS_INTERVAL),
        ]
        due = [0.0 for _ in jobs]
        elapsed = 0.0
        tick = 0.5
        while not stop.is_set():
            for i, (task, interval) in enumerate(jobs):
                if elapsed >= due[i]:
                    due[i] = elapsed + interval
                    try:
                        task()
                    except Exception:
                        log.exception("scheduled task %s failed", task.name)
            stop.wait(tick)
            elapsed += tick
