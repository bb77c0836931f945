"""The staff API's refusals for a browser: a page with a sign-in link instead of a bare 401 text, and
the OpenAPI document's 401 as JSON (its own renderer would send it as an .yaml file to download)."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse, JsonResponse
from django.template.loader import render_to_string
from drf_spectacular.views import SpectacularAPIView
from rest_framework.response import Response

from core.errors import drf_exception_handler


def _wants_html(request: Any) -> bool:
    return "text/html" in request.META.get("HTTP_ACCEPT", "")


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | HttpResponse | None:
    response = drf_exception_handler(exc, context)
    if response is None or response.status_code not in (401, 403):
        return response
    request = context["request"]
    refused: HttpResponse
    if _wants_html(request):
        page = {"next": request.get_full_path(), "signed_in": request.user.is_authenticated}
        refused = HttpResponse(render_to_string("registration/api_refused.html", page, request=request))
    elif isinstance(context.get("view"), SpectacularAPIView):
        refused = JsonResponse(response.data)
    else:
        return response
    refused.status_code = response.status_code
    if "WWW-Authenticate" in response:
        refused["WWW-Authenticate"] = response["WWW-Authenticate"]
    return refused
