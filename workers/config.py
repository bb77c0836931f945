"""The fleet's configuration (routing, circuits, fleet counts), read from settings once.

Selection reads `get_routing_config()` (a frozen object) per request, never django.conf.settings;
speedinfer's AppConfig builds it at start-up, so a bad value is an ImproperlyConfigured then.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from core import state
from core.cache_policy import CachePolicy

# A stale snapshot is served while a refresh runs beside the request, so the one request a second that
# finds it stale does not wait for the query (it did: ~2 ms at c1 in make bench); but only this long
# past the TTL, so a worker a probe marked down stops taking traffic within TTL + this (CONTRACT).
_STALE_GRACE = 0.5


@dataclass(frozen=True, slots=True)
class RoutingConfig:
    cache: CachePolicy  # the snapshot's
    policy: str  # prefix | least-loaded | random (workers.balancer, workers.prefix)
    load_fresh_for: float  # seconds: a runtime's queue figures older than this steer nothing
    circuit_failure_threshold: int = 3  # consecutive failures that open a circuit
    circuit_cooldown: float = 30.0  # seconds an open circuit waits before one trial
    trial_ttl: float = 120.0  # seconds a claimed half-open trial holds (its call may read this long)
    redis_url: str = ""  # fleet counts shared through Redis; "": this process's only

    def __post_init__(self) -> None:
        if self.policy not in ("prefix", "least-loaded", "random"):
            raise ImproperlyConfigured(
                f"SPEEDINFER_ROUTING_POLICY must be prefix, least-loaded or random, got {self.policy!r}"
            )
        if self.circuit_failure_threshold < 1:
            raise ImproperlyConfigured("SPEEDINFER_CIRCUIT_FAILURE_THRESHOLD must be at least 1")

    @classmethod
    def from_settings(cls) -> RoutingConfig:
        ttl = settings.SPEEDINFER_ROUTING_CACHE_TTL
        return cls(
            cache=CachePolicy(ttl=ttl, serve_stale_for=min(ttl, _STALE_GRACE)),
            policy=settings.SPEEDINFER_ROUTING_POLICY,
            # A few probe intervals: the probe loop stopped.
            load_fresh_for=3 * settings.SPEEDINFER_PROBE_INTERVAL + 5,
            circuit_failure_threshold=settings.SPEEDINFER_CIRCUIT_FAILURE_THRESHOLD,
            circuit_cooldown=settings.SPEEDINFER_CIRCUIT_COOLDOWN,
            # A trial claimed longer ago than the cooldown or one read timeout is abandoned.
            trial_ttl=max(settings.SPEEDINFER_CIRCUIT_COOLDOWN, settings.SPEEDINFER_UPSTREAM_READ_TIMEOUT),
            redis_url=str(settings.REDIS_URL),
        )


_config = state.Lazy("workers.routing.config", RoutingConfig.from_settings)
get_routing_config = _config.get
