from __future__ import annotations

from typing import Any

from core.commands import SpeedInferCommand
from workers.selectors import workers_enabled
from workers.services import workers_probe


class Command(SpeedInferCommand):
    help = "Run every enabled worker's health/discovery probe once, now (what the schedule runs); a line per worker."

    def run(self, *args: Any, **options: Any) -> None:
        results = workers_probe(workers=workers_enabled())
        for worker, result in results:
            worker.refresh_from_db(fields=["circuit_state"])
            ready = ",".join(m for m, ok in result.model_readiness.items() if ok) or "-"
            state = "healthy" if result.healthy else "unhealthy"
            line = f"{worker.worker_id} {state} circuit={worker.circuit_state} ready={ready} {result.latency_ms}ms"
            self.stdout.write(line + (f" error={result.error}" if result.error else ""))
        self.stdout.write(f"probed {len(results)} worker(s)")
