"""The live feed's WebSocket origin check: same-origin or a configured list, whatever ALLOWED_HOSTS says.

channels' AllowedHostsOriginValidator accepts any Origin when ALLOWED_HOSTS is `*`, so
another site's page could open the feed with a signed-in user's session cookie.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings


def _origin(value: str) -> tuple[str, str] | None:
    """(scheme, host[:port]) of an Origin value, lowercased, or None when it is not one."""
    parts = urlsplit(value.strip().lower())
    if parts.scheme not in ("http", "https", "ws", "wss") or not parts.netloc:
        return None
    return parts.scheme, parts.netloc


def origin_allowed(*, origin: str | None, host: str | None, allowed: list[str]) -> bool:
    if origin is None:
        # Browsers always send Origin on a WebSocket handshake; without one the client is
        # not a browser page, so there is no other site's page riding on the cookie.
        return True
    parsed = _origin(origin)
    if parsed is None:
        return False
    if host and parsed[1] == host.strip().lower():
        return True
    return any(_origin(entry) == parsed for entry in allowed)


class SameOriginValidator:
    """ASGI middleware: refuse a handshake whose Origin is neither this host nor listed."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        headers = dict(scope.get("headers") or [])
        origin = headers.get(b"origin")
        host = headers.get(b"host")
        if not origin_allowed(
            origin=origin.decode("latin1") if origin is not None else None,
            host=host.decode("latin1") if host is not None else None,
            allowed=list(settings.SPEEDINFER_WS_ALLOWED_ORIGINS),
        ):
            denier = WebsocketDenier()
            return await denier(scope, receive, send)
        return await self.application(scope, receive, send)
