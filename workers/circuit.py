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
workers.routing's per-process snapshot, not from the database per request; routing wraps
these transitions for the event loop and notes its own in the snapshot at once.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

from django.db.models import Case, DateTimeField, F, Q, Value, When
from django.utils import timezone

from workers.config import get_routing_config
from workers.models import Worker

log = logging.getLogger("speedinfer.circuit")
CLOSED = Worker.Circuit.CLOSED
OPEN = Worker.Circuit.OPEN
HALF_OPEN = Worker.Circuit.HALF_OPEN


def trial_ttl() -> timedelta:
    # A claimed trial whose process died must not keep the worker out forever; a live trial
    # can legitimately take as long as a read timeout.
    return timedelta(seconds=get_routing_config().trial_ttl)


def _trial_cutoffs(now: datetime) -> tuple[datetime, datetime]:
    """(opened before this: cooled down, claimed before this: the trial's claimant is presumed dead)."""
    return now - timedelta(seconds=get_routing_config().circuit_cooldown), now - trial_ttl()


def trial_due(*, state: str, opened_at: datetime | None, claimed_at: datetime | None, now: datetime) -> bool:
    """Whether a half-open trial may be claimed now: the one rule, used by routing's snapshot and
    (as the same cutoffs in SQL) by claim_trial_sync."""
    cooled, stale = _trial_cutoffs(now)
    if state == OPEN:
        return opened_at is None or opened_at <= cooled
    if state == HALF_OPEN:
        return claimed_at is None or claimed_at <= stale
    return False


def circuit_state_sync(worker_id: str) -> tuple[str, int]:
    row = Worker.objects.filter(worker_id=worker_id).values_list("circuit_state", "consecutive_failures").first()
    return (str(row[0]), int(row[1])) if row else (CLOSED, 0)


def record_failure_sync(worker_id: str, *, reason: str) -> tuple[str, int]:
    """Count one failure; opens the circuit at the threshold, or re-opens it when the half-open trial failed.
    Returns the state and failure count after."""
    now = timezone.now()
    opens = Q(circuit_state=HALF_OPEN) | Q(
        circuit_state=CLOSED, consecutive_failures__gte=get_routing_config().circuit_failure_threshold - 1
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
    row = (
        Worker.objects.filter(worker_id=worker_id)
        .values_list("circuit_state", "consecutive_failures", "circuit_opened_at")
        .first()
    )
    if row is None:
        return CLOSED, 0
    state, failures = str(row[0]), int(row[1])
    # Log the transition, not the state: only the failure that opened it (its `now` was
    # written) warns; the failures that follow while it stays open are debug lines.
    if state == OPEN and row[2] == now:
        log.warning("worker %s circuit open after %d consecutive failures (%s)", worker_id, failures, reason)
    elif state == OPEN:
        log.debug("worker %s circuit still open after %d consecutive failures (%s)", worker_id, failures, reason)
    return state, failures


def _first_sighting_sync(key: str, ttl: float) -> bool:
    from django.core.cache import cache

    return bool(cache.add(key, 1, timeout=max(1, round(ttl))))


async def first_failure_of(*, worker_id: str, fingerprint: str) -> bool:
    """Whether this failure is the first, within the circuit cooldown, of the client request named by
    `fingerprint` on this worker: a client's retries of one failing request (the openai SDK retries a
    5xx or a timeout twice) count once against the circuit, so one bad request cannot open it.

    The fingerprint is kept in the cache for the cooldown (Redis in production, so it holds across
    gateway processes; the process's memory in the embedded profile, which runs one). With the cache
    unreachable every failure counts, as before."""
    key = f"si:circuit-retry:{worker_id}:{fingerprint}"
    try:
        return await asyncio.to_thread(_first_sighting_sync, key, get_routing_config().circuit_cooldown)
    except Exception:
        log.warning("the circuit's retry fingerprints are unreachable; the failure counts", exc_info=True)
        return True


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


def record_probe_success_sync(worker_id: str) -> bool:
    """A probe succeeded. Once the cooldown is over a probe serves as the trial, so a worker that came
    back is closed again without waiting for a customer's request to risk it."""
    cutoff = timezone.now() - timedelta(seconds=get_routing_config().circuit_cooldown)
    eligible = Q(circuit_state=HALF_OPEN) | Q(circuit_state=OPEN, circuit_opened_at__lte=cutoff)
    eligible |= Q(circuit_state=CLOSED, consecutive_failures__gt=0)
    updated = (
        Worker.objects.filter(worker_id=worker_id)
        .filter(eligible)
        .update(circuit_state=CLOSED, consecutive_failures=0, circuit_opened_at=None, half_open_claimed_at=None)
    )
    return updated == 1


def claim_trial_sync(worker_id: str) -> bool:
    """Try to take the one half-open trial; True for exactly one caller across all processes."""
    now = timezone.now()
    cooled_cutoff, stale_cutoff = _trial_cutoffs(now)
    cooled = Q(circuit_state=OPEN, circuit_opened_at__lte=cooled_cutoff)
    stale = Q(circuit_state=HALF_OPEN, half_open_claimed_at__lte=stale_cutoff)
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
