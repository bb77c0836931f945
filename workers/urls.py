from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from workers.views import health

urlpatterns: list[URLPattern | URLResolver] = [
    path("health", health, name="health"),
]
