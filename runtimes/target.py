"""The worker a request goes to: everything a runtime client needs to call it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class WorkerTarget:
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
