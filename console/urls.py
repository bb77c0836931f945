from __future__ import annotations

from django.urls import URLPattern, URLResolver, include, path

from console import pages

urlpatterns: list[URLPattern | URLResolver] = [
    path("", pages.landing, name="landing"),
    path("models/", pages.prices, name="prices"),
    path("docs/", pages.docs, name="docs"),
    path("docs/v1.json", pages.v1_openapi, name="docs-v1-json"),
    path("docs/v1/", pages.v1_redoc, name="docs-v1"),
    path("dashboard/", include("console.dashboard.urls")),
]
