"""Per-worker circuit breaker shared by every gateway process.

closed -> open after SPEEDINFER_CIRCUIT_FAILURE_THRESHOLD consecutive failures
(connection error, timeout, 5xx; from a probe or a live request); open ->
half_open after SPEEDINFER_CIRCUIT_COOLDOWN seconds, where exactly one trial is
let through (claimed race-safely across processes); success closes it again.

The state lives in the worker's row, so it is shared by the gateway processes,
the probe loop and the Celery workers alike, on PostgreSQL and on the embedded
SQLite. Every transition is one conditional UPDATE: each reads the old row
values in its own SET/WHERE, so two processes can't both open, or both claim
the half-open trial (the row count says who won). Gateways learn the state from
workers.routing's per-process snapshot, not from the database per request.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db.models import Case, DateTimeField, F, Q, Value, When
from django.utils import timezone

from speedinfer.db import db_call
from workers.models import Worker

log = logging.getLogger("speedinfer.circuit")
CLOSED = Worker.Circuit.CLOSED
OPEN = Worker.Circuit.OPEN
HALF_OPEN = Worker.Circuit.HALF_OPEN


def _trial_ttl() -> timedelta:
    # A claimed trial whose process died must not keep the worker out forever; a live trial
    # can legitimately take as long as a read timeout.
    return timedelta(seconds=max(settings.SPEEDINFER_CIRCUIT_COOLDOWN, settings.SPEEDINFER_UPSTREAM_READ_TIMEOUT))


def circuit_state_sync(worker_id: str) -> tuple[str, int]:
    row = Worker.objects.filter(worker_id=worker_id).values_list("circuit_state", "consecutive_failures").first()
    return (str(row[0]), int(row[1])) if row else (CLOSED, 0)


def record_failure_sync(worker_id: str, *, reason: str) -> str:
    """Count one failure; opens the circuit at the threshold, or re-opens it when the half-open trial failed.
    Returns the state after."""
    now = timezone.now()
    opens = Q(circuit_state=HALF_OPEN) | Q(
        circuit_state=CLOSED, consecutive_failures__gte=settings.SPEEDINFER_CIRCUIT_FAILURE_THRESHOLD - 1
    )
    Worker.objects.filter(worker_id=worker_id).update(
        consecutive_failures=F("consecutive_failures") + 1,
        circuit_state=Case(When(opens, then=Value(OPEN)), default=F("circuit_state")),
        circuit_opened_at=Case(
            When(opens, then=Value(now)), default=F("circuit_opened_at"), output_field=DateTimeField()
        ),
        half_open_claimed_at=Case(
            When(opens, then=Value(None)), default=F("half_open_claimed_at"), output_field=DateTimeField()
        ),
        last_failure_reason=reason[:200],
    )
    state, failures = circuit_state_sync(worker_id)
    if state == OPEN:
        log.warning("worker %s circuit open after %d consecutive failures (%s)", worker_id, failures, reason)
    _note_local(worker_id, state=state, failures=failures)
    return state


def record_success_sync(worker_id: str) -> None:
    """A live request succeeded: the half-open trial closes the circuit; a closed one forgets its failures.
    An open circuit stays open (the request began before it opened)."""
    updated = (
        Worker.objects.filter(worker_id=worker_id, circuit_state__in=[CLOSED, HALF_OPEN])
        .exclude(circuit_state=CLOSED, consecutive_failures=0)
        .update(circuit_state=CLOSED, consecutive_failures=0, circuit_opened_at=None, half_open_claimed_at=None)
    )
    if updated:
        log.info("worker %s circuit closed", worker_id)
    _note_local(worker_id, state=CLOSED, failures=0)


def record_probe_success_sync(worker_id: str) -> None:
    """A probe succeeded. Once the cooldown is over a probe serves as the trial, so a worker that came
    back is closed again without waiting for a customer's request to risk it."""
    cutoff = timezone.now() - timedelta(seconds=settings.SPEEDINFER_CIRCUIT_COOLDOWN)
    eligible = Q(circuit_state=HALF_OPEN) | Q(circuit_state=OPEN, circuit_opened_at__lte=cutoff)
    eligible |= Q(circuit_state=CLOSED, consecutive_failures__gt=0)
    updated = (
        Worker.objects.filter(worker_id=worker_id)
        .filter(eligible)
        .update(circuit_state=CLOSED, consecutive_failures=0, circuit_opened_at=None, half_open_claimed_at=None)
    )
    if updated:
        _note_local(worker_id, state=CLOSED, failures=0)


def claim_trial_sync(worker_id: str) -> bool:
    """Try to take the one half-open trial; True for exactly one caller across all processes."""
    now = timezone.now()
    cooled = Q(circuit_state=OPEN, circuit_opened_at__lte=now - timedelta(seconds=settings.SPEEDINFER_CIRCUIT_COOLDOWN))
    stale = Q(circuit_state=HALF_OPEN, half_open_claimed_at__lte=now - _trial_ttl())
    won = (
        Worker.objects.filter(worker_id=worker_id)
        .filter(cooled | stale)
        .update(circuit_state=HALF_OPEN, half_open_claimed_at=now)
    ) == 1
    if won:
        log.info("worker %s circuit half-open: trial claimed", worker_id)
    return won


def reset_sync(worker_id: str) -> None:
    """Staff action: close the circuit and forget the failures."""
    Worker.objects.filter(worker_id=worker_id).update(
        circuit_state=CLOSED, consecutive_failures=0, circuit_opened_at=None, half_open_claimed_at=None
    )
    _note_local(worker_id, state=CLOSED, failures=0)


def _note_local(worker_id: str, *, state: str, failures: int) -> None:
    from workers import routing

    routing.note_circuit(worker_id, state=state, failures=failures)


async def record_success(worker_id: str) -> None:
    """Called by the gateway after every successful upstream call: no I/O while the circuit is closed
    with no failures (the common case), as this process's snapshot knows."""
    from workers import routing

    if routing.circuit_is_clean(worker_id):
        return
    await db_call(record_success_sync)(worker_id)


async def record_failure(worker_id: str, *, reason: str) -> None:
    """Called by the gateway after an upstream connection error, timeout or 5xx."""
    await db_call(record_failure_sync)(worker_id, reason=reason)


async def claim_trial(worker_id: str) -> bool:
    return await db_call(claim_trial_sync)(worker_id)


async def reset(worker_id: str) -> None:
    await db_call(reset_sync)(worker_id)
