"""This app's part of the staff REST API under /api/."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from workers.api import WorkerDetailApi, WorkerListApi

urlpatterns: list[URLPattern | URLResolver] = [
    path("workers/", WorkerListApi.as_view(), name="api-workers"),
    path("workers/<str:worker_id>/", WorkerDetailApi.as_view(), name="api-worker"),
]
