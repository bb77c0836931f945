"""GET /metrics: the request series (core.metrics) and the apps' scrape-time gauges together."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from billing.metrics import ReservationCollector
from core.metrics import exposition
from core.outages import DB_ERRORS
from workers.metrics import WorkerCollector

log = logging.getLogger("speedinfer.metrics")


class _UnlessDatabaseDown(Collector):
    """A collector that reads the database, left out of the scrape while the database is unreachable: the
    process's own series (queued settles among them: docs/prometheus/alerts.yml) are served all the same,
    which is when they matter."""

    def __init__(self, inner: Collector) -> None:
        self.inner = inner

    def collect(self) -> Iterator[Metric]:
        try:
            families = list(self.inner.collect())
        except DB_ERRORS as exc:
            log.warning("/metrics: the database is unreachable; %s left out: %s", type(self.inner).__name__, exc)
            return iter(())
        return iter(families)


_STATE: list[Collector] = [_UnlessDatabaseDown(WorkerCollector()), _UnlessDatabaseDown(ReservationCollector())]


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse(exposition(_STATE), content_type=CONTENT_TYPE_LATEST)
