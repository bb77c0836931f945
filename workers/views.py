from __future__ import annotations

import logging

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from core.outages import DB_ERRORS
from workers.selectors import health_report

log = logging.getLogger("speedinfer.health")


@require_GET
def health(request: HttpRequest) -> JsonResponse:
    """GET /health (docs/interface.md, HTTP): public, so nothing in it names an endpoint, credential or metadata.
    With the database unreachable: 503 and JSON naming it (no error text: it may name the host)."""
    try:
        response = JsonResponse(health_report())
    except DB_ERRORS as exc:
        log.warning("/health: the database is unreachable: %s", type(exc).__name__)
        response = JsonResponse({"status": "unavailable", "database": "unreachable", "workers": []}, status=503)
    response["Cache-Control"] = "no-store"
    return response
