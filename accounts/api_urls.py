"""This app's part of the staff REST API under /api/."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from accounts import api

urlpatterns: list[URLPattern | URLResolver] = [
    path("accounts/", api.AccountListApi.as_view(), name="api-accounts"),
    path("accounts/<int:account_id>/", api.AccountDetailApi.as_view(), name="api-account"),
    path("accounts/<int:account_id>/credits/", api.CreditGrantApi.as_view(), name="api-account-credits"),
    path("accounts/<int:account_id>/keys/", api.AccountKeysApi.as_view(), name="api-account-keys"),
    path("keys/", api.KeyListApi.as_view(), name="api-keys"),
    path("keys/<int:key_id>/", api.KeyDetailApi.as_view(), name="api-key"),
    path("keys/<int:key_id>/revoke/", api.KeyRevokeApi.as_view(), name="api-key-revoke"),
]
