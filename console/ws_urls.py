"""WebSocket routes, mounted by speedinfer.asgi under the session auth middleware."""

from __future__ import annotations

from django.urls import path

from console.consumers import UsageConsumer

websocket_urlpatterns = [
    path("ws/usage/", UsageConsumer.as_asgi()),
]
