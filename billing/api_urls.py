"""This app's part of the staff REST API under /api/."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from billing.api import ModelDetailApi, ModelListApi

urlpatterns: list[URLPattern | URLResolver] = [
    path("models/", ModelListApi.as_view(), name="api-models"),
    # Model ids contain slashes (acme/llama-3-8b).
    path("models/<path:model_id>", ModelDetailApi.as_view(), name="api-model"),
]
