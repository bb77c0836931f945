"""One record of how a /v1 request ended.

The gateway builds it once per request (proxy.exchange creates it, the request path fills it in) and
hands the same object to the ledger (the usage row's worker, endpoint, latency, time to first token),
to the metrics (core.metrics.observe_request) and to the request log line (core.request_log).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestOutcome:
    request_id: str
    endpoint: str = ""  # the /v1 path, or "other" for an unknown URL
    started: float = field(default_factory=time.perf_counter)  # perf_counter() at arrival
    status: int = 0  # the HTTP status; for a stream that failed after its 200, the real outcome
    error_code: str = ""
    account_id: int | None = None
    key_prefix: str = ""  # the key's public prefix, never the secret
    model: str = ""
    worker_id: str = ""
    streamed: bool = False
    ttft: float | None = None  # seconds from arrival to the first streamed event
    latency: float | None = None  # seconds, when fixed (a record made outside the gateway); else elapsed()
    prompt_tokens: int = 0
    completion_tokens: int = 0
    queue_wait_ms: int = 0  # time it waited in the gateway for a capacity slot (workers.queue)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def duration(self) -> float:
        """Seconds the request took: the fixed latency, else the time since it arrived."""
        return self.latency if self.latency is not None else self.elapsed()

    def latency_ms(self) -> int:
        return round(self.duration() * 1000)

    def ttft_ms(self) -> int | None:
        return round(self.ttft * 1000) if self.ttft is not None else None
