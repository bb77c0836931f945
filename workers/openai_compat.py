"""OpenAI-compatible workers (transport `openai`, every `cuda` worker): model discovery for health.

Requests to chat/completions and completions are proxied by the gateway (proxy app).
"""

from __future__ import annotations

import httpx

from workers.errors import UpstreamError, UpstreamTimeout
from workers.http import get_client
from workers.routing import WorkerView


def auth_headers(worker: WorkerView) -> dict[str, str]:
    """The worker's own credential, when it has one (never logged)."""
    return {"Authorization": f"Bearer {worker.upstream_api_key}"} if worker.upstream_api_key else {}


async def openai_models(
    *, worker: WorkerView, http_timeout: httpx.Timeout, client: httpx.AsyncClient | None = None
) -> tuple[list[str] | None, str]:
    """GET {endpoint}/models: (the model ids it serves, "") or (None, why) on a 4xx or an unreadable answer.

    Raises UpstreamError/UpstreamTimeout when unreachable or on a 5xx (worker faults)."""
    client = client or get_client()
    try:
        response = await client.get(f"{worker.endpoint}/models", headers=auth_headers(worker), timeout=http_timeout)
    except httpx.TimeoutException as exc:
        raise UpstreamTimeout("the worker did not answer in time", detail=repr(exc)) from None
    except httpx.HTTPError as exc:
        raise UpstreamError("the worker could not be reached", detail=repr(exc)) from None
    if response.status_code >= 500:
        raise UpstreamError(f"/models answered {response.status_code}", detail=response.text[:500])
    if response.status_code != 200:
        return None, f"/models answered {response.status_code}"
    try:
        body = response.json()
    except ValueError:
        return None, "/models answered something that is not JSON"
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return None, "/models has no data list"
    return [str(item["id"]) for item in data if isinstance(item, dict) and "id" in item], ""
