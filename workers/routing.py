"""Worker selection for the gateway. (Interface fixed here; the workers issue fills it in.)

The gateway must not hit the database per request to learn health or circuit
state: selection reads a per-process snapshot refreshed every
SPEEDINFER_ROUTING_CACHE_TTL seconds, plus the shared circuit state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class WorkerView:
    """What the gateway needs to call a worker. Never logged or shown: it holds the endpoint."""

    pk: int
    worker_id: str
    runtime: str
    transport: str  # "triton" or "openai"
    endpoint: str  # runtime_endpoint, without a trailing slash
    runtime_config: dict[str, Any] = field(default_factory=dict)
    upstream_api_key: str = ""

    def upstream_model(self, public_model_id: str) -> str:
        """The model id the worker knows for a public id (runtime_config.model_map, else the same)."""
        mapping = self.runtime_config.get("model_map") or {}
        return str(mapping.get(public_model_id, public_model_id))


async def eligible_workers(model_id: str) -> list[WorkerView]:
    """Enabled, healthy, circuit closed (or this caller won the half-open trial), declaring
    `model_id`, and with that model ready; ordered by preference (least in-flight first)."""
    raise NotImplementedError


def model_transports(model_id: str) -> set[str]:
    """Transports of the enabled workers declaring `model_id` (for streaming_unsupported)."""
    raise NotImplementedError
