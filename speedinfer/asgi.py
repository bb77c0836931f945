"""ASGI entry point: `speedinfer.asgi:application` (daphne, uvicorn or granian)."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "speedinfer.settings")

django_asgi_app = get_asgi_application()

# The imports below need Django set up first.
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from console.ws_origin import SameOriginValidator  # noqa: E402
from console.ws_urls import websocket_urlpatterns  # noqa: E402
from proxy.asgi import with_gateway  # noqa: E402
from speedinfer.lifespan import lifespan_app  # noqa: E402

application = ProtocolTypeRouter(
    {
        # /v1/* is the lean gateway app (no Django middleware on the hot path); the rest is Django.
        "http": with_gateway(django_asgi_app),
        # The session cookie authenticates the dashboard's live feed; the origin
        # check (same-origin or SPEEDINFER_WS_ALLOWED_ORIGINS) stops another site's
        # page from opening it with that cookie.
        "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
        "lifespan": lifespan_app,
    }
)
