"""GET /metrics: the request series (core.metrics) and the apps' scrape-time gauges together."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

from billing.metrics import ReservationCollector
from core.metrics import exposition
from workers.metrics import WorkerCollector

_STATE = [WorkerCollector(), ReservationCollector()]


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse(exposition(_STATE), content_type=CONTENT_TYPE_LATEST)
