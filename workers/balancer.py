"""Which eligible worker is expected to answer soonest (docs/interface.md, HTTP: Routing). Pure scoring plus a little
per-process state: each gateway process's own observed latencies and recent failures.

    cost(w) = L(w) * (I(w) + Q(w) + 1)

- L(w): peak-EWMA of the latency this process observed calling w (the answer for a plain request, the
  first event for a stream), as Finagle's and Linkerd's balancers keep it: a slower observation is taken
  at once (the peak), a faster one is blended in with weight 1 - exp(-dt/DECAY_S), and the estimate
  decays toward zero while w is not called, so a worker left idle because it was slow is tried again
  after a while (about 14 s for one four times slower). A worker not yet observed borrows the lowest
  estimate among the candidates (optimistic, so it gets tried); none observed: all 1. Floor: the mean
  time requests recently waited in w's own queue, where the runtime publishes it.
- I(w): requests in flight to w from every gateway process (workers.fleet; this process's own exact,
  the others' as of the last sync, at most ~0.5 s old).
- Q(w): requests waiting in w's own queue, as its metrics endpoint said at the last probe.

So an idle fast worker beats an idle slow one (L), and a busy fast one yields to an idle slow one once
L_fast * (I_fast + 1) > L_slow. A worker that failed (a connection error, timeout or 5xx) in the last
FAILURE_S seconds goes after every worker that did not, whatever its cost. The pick among more than
two candidates is the cheaper of two drawn at random (power of two choices: gateways whose views of the
fleet lag behind do not all pile onto the one cheapest worker); with two it is the cheaper one. Ties go
to a random worker. The rest follow by cost, for the gateway's fallback.

SPEEDINFER_ROUTING_POLICY=random ignores all of this and shuffles (for comparison, as `make bench` does).

SPEEDINFER_ROUTING_POLICY=prefix (the default) puts a prefix holder first: of the workers that were sent
the longest run of the request's prompt blocks recently (workers.prefix, Candidate.matched), the cheapest
by cost(w) whose load I(w) + Q(w) is at most BOUND_C * mean + 1 over the candidates (bounded load, as in
consistent hashing with bounded loads: a hot prefix outgrows its holder, spills to the least-loaded
worker, which then holds it too, so it spreads instead of melting one GPU). No holder within the bound,
or no match: the least-loaded rule above. docs/scheduler.md has the argument and the figures.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from core import state

DECAY_S = 10.0
FAILURE_S = 10.0
POLICIES = ("prefix", "least-loaded", "random")
# A holder may carry this many times the mean load (+1) before its prefix stops outweighing the load.
BOUND_C = 1.5


@dataclass(frozen=True, slots=True)
class Candidate:
    worker_id: str
    in_flight: int  # fleet-wide
    queue: int = 0  # the runtime's own queue, 0 when it publishes none
    queue_time_s: float = 0.0
    matched: int = 0  # prompt blocks from the start this worker was sent recently (workers.prefix)


@dataclass(slots=True)
class _Ewma:
    value: float  # seconds
    at: float  # time.monotonic() of the last observation


_latency: dict[str, _Ewma] = {}
_failed_at: dict[str, float] = {}


def _decayed(entry: _Ewma, now: float) -> float:
    return entry.value * math.exp(-max(0.0, now - entry.at) / DECAY_S)


def observe(worker_id: str, latency_s: float, *, ok: bool = True, now: float | None = None) -> None:
    """One call to the worker took latency_s. A failed call can raise the estimate, never lower it
    (a worker that fails fast must not look fast)."""
    now = time.monotonic() if now is None else now
    entry = _latency.get(worker_id)
    if entry is None:
        _latency[worker_id] = _Ewma(latency_s, now)
        return
    current = _decayed(entry, now)
    if latency_s >= current:
        entry.value = latency_s
    elif ok:
        weight = math.exp(-max(0.0, now - entry.at) / DECAY_S)
        entry.value = entry.value * weight + latency_s * (1 - weight)
    else:
        entry.value = current
    entry.at = now


def note_failure(worker_id: str, *, now: float | None = None) -> None:
    _failed_at[worker_id] = time.monotonic() if now is None else now


def latency_estimate(worker_id: str, *, now: float | None = None) -> float | None:
    entry = _latency.get(worker_id)
    return None if entry is None else _decayed(entry, time.monotonic() if now is None else now)


def failed_recently(worker_id: str, *, now: float | None = None) -> bool:
    at = _failed_at.get(worker_id)
    return at is not None and (time.monotonic() if now is None else now) - at < FAILURE_S


def costs(candidates: Sequence[Candidate], *, now: float) -> list[float]:
    estimates = [latency_estimate(c.worker_id, now=now) for c in candidates]
    known = [e for e in estimates if e is not None]
    default = min(known) if known else 1.0
    return [
        max(default if e is None else e, c.queue_time_s) * (c.in_flight + c.queue + 1)
        for c, e in zip(candidates, estimates, strict=True)
    ]


def order(candidates: Sequence[Candidate], *, policy: str = "least-loaded") -> list[Candidate]:
    """The candidates, the pick first, the rest by cost."""
    shuffled = list(candidates)
    random.shuffle(shuffled)  # ties keep this random order through the stable sort
    if policy == "random" or len(shuffled) < 2:
        return shuffled
    now = time.monotonic()
    keys = [
        (failed_recently(c.worker_id, now=now), cost)
        for c, cost in zip(shuffled, costs(shuffled, now=now), strict=True)
    ]
    ranked = [c for _, c in sorted(zip(keys, shuffled, strict=True), key=lambda pair: pair[0])]
    if policy == "prefix":
        holder = _holder(ranked, failed={c.worker_id for c, key in zip(shuffled, keys, strict=True) if key[0]})
        if holder is not None:
            ranked.remove(holder)
            return [holder, *ranked]
    if len(ranked) > 2:
        # Two choices drawn at random, the cheaper taken: in the ranked list, the lower index.
        first, second = random.sample(range(len(ranked)), 2)
        ranked.insert(0, ranked.pop(min(first, second)))
    return ranked


def _holder(ranked: list[Candidate], *, failed: set[str]) -> Candidate | None:
    """The prefix holder to prefer, or None: the longest match within the load bound, the cheapest of
    those (`ranked` is by cost)."""
    best = 0
    for c in ranked:
        if c.matched > best and c.worker_id not in failed:
            best = c.matched
    if not best:
        return None
    bound = BOUND_C * sum(c.in_flight + c.queue for c in ranked) / len(ranked) + 1
    for c in ranked:
        if c.matched == best and c.worker_id not in failed and c.in_flight + c.queue <= bound:
            return c
    # The longest holders are too busy: a shorter match within the bound still saves some prefill.
    within = [c for c in ranked if c.matched and c.worker_id not in failed and c.in_flight + c.queue <= bound]
    return max(within, key=lambda c: c.matched) if within else None


def view() -> dict[str, dict[str, float | bool]]:
    """This process's figures per worker, for the admin and /metrics."""
    now = time.monotonic()
    return {
        worker_id: {"latency_ms": _decayed(entry, now) * 1000, "failed_recently": failed_recently(worker_id, now=now)}
        for worker_id, entry in _latency.items()
    }


def forget() -> None:
    """Drop what this process observed (tests)."""
    _latency.clear()
    _failed_at.clear()


state.register("workers.balancer", forget)
