from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from workers.selectors import health_report


@require_GET
def health(request: HttpRequest) -> JsonResponse:
    """GET /health (CONTRACT): public, so nothing in it names an endpoint, credential or metadata."""
    report = health_report()
    response = JsonResponse(report)
    response["Cache-Control"] = "no-store"
    return response
