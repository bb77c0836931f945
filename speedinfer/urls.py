from __future__ import annotations

from django.contrib import admin
from django.contrib.staticfiles.views import serve as static_serve
from django.urls import include, path, re_path

from speedinfer.metrics import metrics_view

api_patterns = [
    path("", include("workers.api_urls")),
    path("", include("accounts.api_urls")),
    path("", include("billing.api_urls")),
]

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics", metrics_view, name="metrics"),
    # The embedded default has no web server in front: Django serves the static
    # files (admin CSS, the vendored Chart.js) itself, found in place, no collectstatic.
    re_path(r"^static/(?P<path>.+)$", static_serve, {"insecure": True}),
    path("api/", include(api_patterns)),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("workers.urls")),
    path("", include("accounts.urls")),
    path("", include("billing.urls")),
    path("", include("proxy.urls")),
]
