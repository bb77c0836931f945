from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

api_patterns = [
    path("", include("workers.api_urls")),
    path("", include("accounts.api_urls")),
    path("", include("billing.api_urls")),
]

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include(api_patterns)),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("workers.urls")),
    path("", include("accounts.urls")),
    path("", include("billing.urls")),
    path("", include("proxy.urls")),
]
