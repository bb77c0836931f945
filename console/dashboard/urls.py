from __future__ import annotations

from django.urls import path

from console.dashboard import alerts, views

app_name = "dashboard"

urlpatterns = [
    path("", views.home, name="home"),
    path("usage/", views.usage, name="usage"),
    path("usage.csv", views.usage_csv, name="usage_csv"),
    path("keys/", views.keys, name="keys"),
    path("keys/created/", views.key_created, name="key_created"),
    path("keys/<int:key_id>/revoke/", views.key_revoke, name="key_revoke"),
    path("keys/<int:key_id>/budget/", views.key_budget, name="key_budget"),
    path("models/", views.models, name="models"),
    path("alerts/", alerts.alerts, name="alerts"),
]
