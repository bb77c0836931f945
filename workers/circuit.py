"""Per-worker circuit breaker shared by every gateway process. (Interface; the workers issue fills it in.)

closed -> open after SPEEDINFER_CIRCUIT_FAILURE_THRESHOLD consecutive failures
(connection error, timeout, 5xx; from a probe or a live request); open ->
half_open after SPEEDINFER_CIRCUIT_COOLDOWN seconds, where exactly one trial is
let through (claimed race-safely across processes); success closes it again.
"""

from __future__ import annotations


async def record_success(worker_id: str) -> None:
    raise NotImplementedError


async def record_failure(worker_id: str, *, reason: str) -> None:
    raise NotImplementedError
