from __future__ import annotations

from django.contrib import admin
from django.contrib.staticfiles.views import serve as static_serve
from django.urls import include, path, re_path

from speedinfer.metrics import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics", metrics_view, name="metrics"),
    # The embedded default has no web server in front: Django serves the static
    # files (admin CSS, the vendored Chart.js) itself, found in place, no collectstatic.
    re_path(r"^static/(?P<path>.+)$", static_serve, {"insecure": True}),
    # Browsers ask for it on every first visit; a 404 there is noise in every log.
    path("favicon.ico", static_serve, {"path": "favicon.ico", "insecure": True}),
    path("api/", include("console.api.urls")),
    path("accounts/", include("console.auth_urls")),
    path("", include("workers.urls")),
    path("", include("console.urls")),
]

# A database outage is a 503 page for people (the dashboard, the admin), never a 500 with a traceback.
handler500 = "console.outage.server_error"
