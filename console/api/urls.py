"""The staff REST API under /api/ (workers, models, accounts, keys, credits)."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from console.api import accounts, models, workers

urlpatterns: list[URLPattern | URLResolver] = [
    # The API's own OpenAPI document and its Swagger UI (static files from drf-spectacular-sidecar).
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("workers/", workers.WorkerListApi.as_view(), name="api-workers"),
    path("workers/<str:worker_id>/", workers.WorkerDetailApi.as_view(), name="api-worker"),
    path("models/", models.ModelListApi.as_view(), name="api-models"),
    path("models/<path:model_id>", models.ModelDetailApi.as_view(), name="api-model"),
    path("accounts/", accounts.AccountListApi.as_view(), name="api-accounts"),
    path("accounts/<int:account_id>/", accounts.AccountDetailApi.as_view(), name="api-account"),
    path("accounts/<int:account_id>/credits/", accounts.CreditGrantApi.as_view(), name="api-account-credits"),
    path("accounts/<int:account_id>/keys/", accounts.AccountKeysApi.as_view(), name="api-account-keys"),
    path("keys/", accounts.KeyListApi.as_view(), name="api-keys"),
    path("keys/<int:key_id>/", accounts.KeyDetailApi.as_view(), name="api-key"),
    path("keys/<int:key_id>/revoke/", accounts.KeyRevokeApi.as_view(), name="api-key-revoke"),
    path("keys/<int:key_id>/budget/", accounts.KeyBudgetApi.as_view(), name="api-key-budget"),
]
