"""Worker selection for the gateway.

The gateway must not hit the database per request to learn health or circuit
state: selection reads a per-process snapshot of the enabled workers, refreshed
at most every SPEEDINFER_ROUTING_CACHE_TTL seconds (core.cache_policy; one query, shared by all
coroutines of the process). The database is touched on the request path only to
claim a half-open trial, at most once per worker per refresh in a process.

The order is workers.balancer's: the worker expected to answer soonest first, from the
fleet's in-flight counts (workers.fleet; the gateway counts each upstream call with
acquire()/release() and reports its latency on release), the runtime's own queue (from
the probes, in the snapshot) and this process's observed latencies. The gateway takes
the first worker and falls back to the second.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone

from core import state
from core.db import db_call
from runtimes.target import WorkerTarget
from workers import balancer, circuit, fleet, prefix, queue
from workers.config import get_routing_config
from workers.models import Worker

log = logging.getLogger("speedinfer.circuit")


@dataclass(slots=True)
class _Entry:
    view: WorkerTarget
    models: frozenset[str]
    ready_models: frozenset[str]
    healthy: bool
    circuit: str
    failures: int
    opened_at: datetime | None
    claimed_at: datetime | None
    last_probe_at: datetime | None
    queue: int = 0  # the runtime's own queue at the last probe (0: not published, or too old)
    queue_time_s: float = 0.0
    capacity: int | None = None  # requests it runs at once (workers.queue); None: not known, not gated


@dataclass(slots=True)
class _Snapshot:
    entries: dict[str, _Entry]
    loaded_at: float


_EMPTY = _Snapshot(entries={}, loaded_at=float("-inf"))
_snapshot: _Snapshot = _EMPTY
_refreshing: state.LoopLocal[asyncio.Task[_Snapshot]] = state.LoopLocal("workers.routing.refreshing")
# Workers this process could not connect to, with the last probe time the snapshot knew then: they
# are skipped until a later probe has looked at them (and, if it found them healthy, they return).
_unreachable: dict[str, datetime | None] = {}


def _load() -> _Snapshot:
    entries: dict[str, _Entry] = {}
    load_since = timezone.now() - timedelta(seconds=get_routing_config().load_fresh_for)
    for w in Worker.objects.filter(enabled=True):
        readiness = w.model_readiness or {}
        load_fresh = w.runtime_load_at is not None and w.runtime_load_at >= load_since
        entries[w.worker_id] = _Entry(
            view=w.target(),
            models=frozenset(w.supported_models),
            ready_models=frozenset(m for m, ok in readiness.items() if ok),
            healthy=w.healthy,
            circuit=w.circuit_state,
            failures=w.consecutive_failures,
            opened_at=w.circuit_opened_at,
            claimed_at=w.half_open_claimed_at,
            last_probe_at=w.last_probe_at,
            queue=(w.runtime_queue or 0) if load_fresh else 0,
            queue_time_s=(w.runtime_queue_time_ms or 0.0) / 1000 if load_fresh else 0.0,
            capacity=_capacity(w, load_fresh=load_fresh),
        )
    return _Snapshot(entries=entries, loaded_at=time.monotonic())


def _capacity(w: Worker, *, load_fresh: bool) -> int | None:
    """How many requests the worker runs at once: runtime_config.max_concurrency where declared, else
    the runtime's own figure (TensorRT-LLM's max active requests; a vLLM that is queueing runs as many
    as it can, so what it runs then is its batch capacity). None: unknown, so never gated."""
    declared = (w.runtime_config or {}).get("max_concurrency")
    if isinstance(declared, int) and not isinstance(declared, bool) and declared > 0:
        return declared
    if not load_fresh:
        return None
    if w.runtime_max_running:
        return w.runtime_max_running
    if w.runtime_queue and w.runtime_running:
        return w.runtime_running
    return None


def capacity(worker_id: str) -> int | None:
    """The worker's capacity as the snapshot knows it (None: unknown, never gated)."""
    entry = _snapshot.entries.get(worker_id)
    return entry.capacity if entry is not None else None


def _fresh(snap: _Snapshot) -> bool:
    return get_routing_config().cache.fresh(time.monotonic() - snap.loaded_at)


def _store(snap: _Snapshot) -> _Snapshot:
    global _snapshot
    _snapshot = snap
    return snap


async def _current() -> _Snapshot:
    """The snapshot, refreshed when stale; concurrent callers share one refresh query."""
    snap = _snapshot
    if _fresh(snap):
        return snap
    task = _refresh_task()
    if get_routing_config().cache.servable(time.monotonic() - snap.loaded_at):
        return snap
    return await asyncio.shield(task)


def _refresh_task() -> asyncio.Task[_Snapshot]:
    """This loop's refresh, started if none runs (concurrent callers share it)."""
    task = _refreshing.get()
    if task is None or task.done():
        task = asyncio.ensure_future(_refresh_async())
        # A refresh nobody awaited (its requests were served the stale snapshot) may fail with the
        # database down: read its exception so the loop does not log it as never retrieved.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        _refreshing.set(task)
    return task


async def _refresh_async() -> _Snapshot:
    return _store(await db_call(_load)())


def _current_sync() -> _Snapshot:
    snap = _snapshot
    if _fresh(snap):
        return snap
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _store(_load())
    # Called from async code: Django forbids the query on the loop's thread, so run it on another.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return _store(pool.submit(_load_and_close).result())


def _load_and_close() -> _Snapshot:
    from django.db import connection

    try:
        return _load()
    finally:
        connection.close()  # the thread ends here; its connection must not linger


def invalidate() -> None:
    """Forget the snapshot (tests; after staff changes in this process)."""
    _store(_EMPTY)


def _reset() -> None:
    invalidate()
    _unreachable.clear()


state.register("workers.routing", _reset)


def note_circuit(worker_id: str, *, state: str, failures: int) -> None:
    """A transition this process made: seen by its next selection without waiting for a refresh."""
    if failures:
        balancer.note_failure(worker_id)  # avoided by this process's next choices for a while
    entry = _snapshot.entries.get(worker_id)
    if entry is not None:
        entry.circuit = state
        entry.failures = failures
        if state == "half_open":
            entry.claimed_at = timezone.now()


def circuit_is_clean(worker_id: str) -> bool:
    """Closed with no failures, as far as this process knows (record_success's free path)."""
    entry = _snapshot.entries.get(worker_id)
    return entry is not None and entry.circuit == "closed" and entry.failures == 0


def _serves(entry: _Entry, model_id: str) -> bool:
    if not (entry.healthy and model_id in entry.models and model_id in entry.ready_models):
        return False
    worker_id = entry.view.worker_id
    if worker_id in _unreachable:
        if _unreachable[worker_id] == entry.last_probe_at:
            return False
        del _unreachable[worker_id]  # probed since, and found healthy
    return True


def mark_unreachable(worker_id: str) -> None:
    """This process's connection to the worker was refused: stop choosing it at once, until a probe
    newer than what this process knows says it is healthy (the circuit counts the failure as well)."""
    entry = _snapshot.entries.get(worker_id)
    _unreachable[worker_id] = entry.last_probe_at if entry is not None else None


def _trial_due(entry: _Entry, now: datetime) -> bool:
    return circuit.trial_due(state=entry.circuit, opened_at=entry.opened_at, claimed_at=entry.claimed_at, now=now)


async def eligible_workers(model_id: str, *, prefix_hashes: list[int] | None = None) -> list[WorkerTarget]:
    """Enabled, healthy, circuit closed (or this caller won the half-open trial), declaring
    `model_id`, and with that model ready; ordered by preference (workers.balancer: the pick first;
    under the prefix policy, `prefix_hashes` (workers.prefix.block_hashes) finds the holders)."""
    fleet.ensure_sync()
    snap = await _current()
    if not _fresh(snap) and not any(_serves(e, model_id) for e in snap.entries.values()):
        # A stale snapshot with no worker for the model: a worker may have just come back, so this
        # request waits for the refresh rather than answering no_healthy_worker from old news.
        snap = await asyncio.shield(_refresh_task())
    now = timezone.now()
    closed: list[_Entry] = []
    trials: list[WorkerTarget] = []
    for entry in snap.entries.values():
        if not _serves(entry, model_id):
            continue
        if entry.circuit == "closed":
            closed.append(entry)
        elif _trial_due(entry, now):
            # Whoever loses, this process stops asking until the next refresh shows the outcome.
            entry.circuit, entry.claimed_at = "half_open", now
            if await db_call(circuit.claim_trial_sync)(entry.view.worker_id):
                trials.append(entry.view)
    now_s = time.monotonic()
    policy = get_routing_config().policy
    matched = prefix.matches(prefix_hashes) if prefix_hashes and policy == "prefix" else {}
    candidates = [
        balancer.Candidate(
            e.view.worker_id,
            _load_of(e.view.worker_id, now_s),
            e.queue,
            e.queue_time_s,
            matched.get(e.view.worker_id, 0),
        )
        for e in closed
    ]
    views = {e.view.worker_id: e.view for e in closed}
    ranked = balancer.order(candidates, policy=policy)
    # A won trial goes first: it must be tried, or the circuit never closes.
    return trials + [views[c.worker_id] for c in ranked]


def _load_of(worker_id: str, now: float) -> int:
    """Requests on the worker from every process: this process's own counted from their placement
    (workers.queue.placed), so a burst being placed spreads before its calls start."""
    mine = fleet.local_count(worker_id)
    return fleet.in_flight(worker_id, now=now) - mine + max(mine, queue.placed(worker_id))


def _transports(snap: _Snapshot, model_id: str) -> set[str]:
    return {e.view.transport for e in snap.entries.values() if model_id in e.models}


def model_transports(model_id: str) -> set[str]:
    """Transports of the enabled workers declaring `model_id` (for streaming_unsupported)."""
    return _transports(_current_sync(), model_id)


async def model_transports_async(model_id: str) -> set[str]:
    return _transports(await _current(), model_id)


async def model_workers_async(model_id: str) -> list[WorkerTarget]:
    """The enabled workers declaring `model_id`, eligible or not (for streaming_unsupported)."""
    return [e.view for e in (await _current()).entries.values() if model_id in e.models]


def in_flight_count(worker_id: str) -> int:
    """This process's calls to the worker now (workers.fleet adds the other processes')."""
    return fleet.local_count(worker_id)


def acquire(worker_id: str) -> None:
    fleet.acquire(worker_id)


def release(worker_id: str, *, latency: float | None = None, ok: bool = True) -> None:
    """The call ended; `latency` (seconds to the answer, or to a stream's first event) feeds the
    balancer's estimate (a failed call, ok=False, can only raise it)."""
    fleet.release(worker_id)
    if latency is not None:
        balancer.observe(worker_id, latency, ok=ok)


async def record_success(worker_id: str) -> None:
    """After every successful upstream call: no I/O while the circuit is closed with no failures
    (the common case), as this process's snapshot knows."""
    if circuit_is_clean(worker_id):
        return
    await db_call(circuit.record_success_sync)(worker_id)
    note_circuit(worker_id, state=circuit.CLOSED, failures=0)


async def record_failure(worker_id: str, *, reason: str, fingerprint: str | None = None) -> None:
    """After an upstream connection error, timeout or 5xx. With the client request's `fingerprint`,
    a retry of a request that already failed on this worker is not counted again
    (circuit.first_failure_of)."""
    if fingerprint is not None and not await circuit.first_failure_of(worker_id=worker_id, fingerprint=fingerprint):
        log.info("worker %s failed a retried request (%s); counted once against the circuit", worker_id, reason)
        return
    state, failures = await db_call(circuit.record_failure_sync)(worker_id, reason=reason)
    note_circuit(worker_id, state=state, failures=failures)
