from __future__ import annotations

from typing import Any

from alerts.services import alerts_send
from core.commands import SpeedInferCommand


class Command(SpeedInferCommand):
    help = (
        "Check every account for low-balance and key-budget crossings once, then deliver the alerts that are "
        "due (new ones and retries) by email and webhook before exiting. The schedule runs the same job."
    )

    def run(self, *args: Any, **options: Any) -> None:
        summary = alerts_send()
        counts = summary.counts
        self.stdout.write(
            f"{summary.raised} alert(s) raised; {counts.delivered} delivered, {counts.retrying} to retry, "
            f"{counts.failed} failed"
        )
