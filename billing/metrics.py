"""Held-reservation gauges, read from the database when Prometheus scrapes."""

from __future__ import annotations

import time
from collections.abc import Iterator

from django.db.models import Count, Min, Sum
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from billing.models import Reservation
from core.credits import MICRO


class ReservationCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        held = Reservation.objects.filter(status=Reservation.Status.HELD).aggregate(
            n=Count("*"), amount=Sum("amount"), oldest=Min("created_at")
        )
        yield GaugeMetricFamily("speedinfer_reservations_held", "Reservations not yet settled.", value=held["n"] or 0)
        yield GaugeMetricFamily(
            "speedinfer_reserved_credits", "Credits held by those reservations.", value=(held["amount"] or 0) / MICRO
        )
        oldest = held["oldest"]
        yield GaugeMetricFamily(
            "speedinfer_reservation_oldest_age_seconds",
            "Age of the oldest held reservation (the sweeper releases it past the TTL).",
            value=max(0.0, time.time() - oldest.timestamp()) if oldest else 0.0,
        )
