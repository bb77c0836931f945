"""How long a per-process cache's copy is served: the one convention for every cache.

A copy younger than `ttl` is fresh and served as is. Older but within `serve_stale_for` past the
TTL, it is still served while one refresh runs beside the request (so no request waits for the
query); older still, the request waits for the refresh. Each cache's TTL is a setting
(SPEEDINFER_<NAME>_CACHE_TTL); the stale window is the cache's own (speedinfer/settings.py lists both).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.core.exceptions import ImproperlyConfigured


@dataclass(frozen=True, slots=True)
class CachePolicy:
    ttl: float  # seconds
    serve_stale_for: float = 0.0  # seconds past the TTL

    def __post_init__(self) -> None:
        if self.ttl < 0 or self.serve_stale_for < 0:
            raise ImproperlyConfigured(f"a cache TTL and stale window must be >= 0, got {self}")

    def fresh(self, age: float) -> bool:
        return age < self.ttl

    def servable(self, age: float) -> bool:
        """Still served (stale) while a refresh runs."""
        return age < self.ttl + self.serve_stale_for
