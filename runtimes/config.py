"""The runtime clients' configuration, read from settings once at the layer's edge.

Calling a worker reads `get_runtime_config()` (a frozen object) on the hot path, never
django.conf.settings; speedinfer's AppConfig builds it at start-up, so a bad value is an
ImproperlyConfigured then.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from core import state


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    connect_timeout: float  # seconds; also the write and pool-wait timeouts
    read_timeout: float  # seconds between two chunks of the answer
    total_timeout: float  # the whole call's deadline
    client: str = "aiohttp"  # which connection pool carries httpx's API
    max_connections: int = 4096  # SPEEDINFER_UPSTREAM_MAX_CONNECTIONS: open upstream calls per process
    max_keepalive_connections: int = 200
    keepalive_expiry: float = 30.0

    def __post_init__(self) -> None:
        for name in ("connect_timeout", "read_timeout", "total_timeout", "keepalive_expiry"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ImproperlyConfigured(f"runtime {name} must be a positive number of seconds, got {value!r}")
        if self.client not in ("aiohttp", "httpx"):
            raise ImproperlyConfigured(f"SPEEDINFER_UPSTREAM_CLIENT must be aiohttp or httpx, got {self.client!r}")
        if not 0 < self.max_keepalive_connections <= self.max_connections:
            raise ImproperlyConfigured("runtime pool limits: 0 < max_keepalive_connections <= max_connections")

    @classmethod
    def from_settings(cls) -> RuntimeConfig:
        return cls(
            connect_timeout=settings.SPEEDINFER_UPSTREAM_CONNECT_TIMEOUT,
            read_timeout=settings.SPEEDINFER_UPSTREAM_READ_TIMEOUT,
            total_timeout=settings.SPEEDINFER_UPSTREAM_TOTAL_TIMEOUT,
            client=settings.SPEEDINFER_UPSTREAM_CLIENT,
            max_connections=settings.SPEEDINFER_UPSTREAM_MAX_CONNECTIONS,
            max_keepalive_connections=min(200, settings.SPEEDINFER_UPSTREAM_MAX_CONNECTIONS),
        )


_config = state.Lazy("runtimes.config", RuntimeConfig.from_settings)
get_runtime_config = _config.get
