from __future__ import annotations

from django.urls import path

from console.dashboard import alerts, members, views

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
    path("members/", members.members, name="members"),
    path("members/<int:membership_id>/role/", members.member_role, name="member_role"),
    path("members/<int:membership_id>/remove/", members.member_remove_view, name="member_remove"),
    path("members/invitations/<int:invitation_id>/revoke/", members.invitation_revoke_view, name="invitation_revoke"),
    path("alerts/", alerts.alerts, name="alerts"),
]
