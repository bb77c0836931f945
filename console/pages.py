"""Public pages outside the dashboard: the landing page at / and the API reference under /docs/."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from console.dashboard.selectors import models_for_customers

_V1_DOCUMENT = Path(__file__).parent / "reference" / "openapi-v1.yaml"


@cache
def v1_document() -> dict[str, Any]:
    """The hand-written OpenAPI document of /v1 (tests check the gateway's answers against it)."""
    loaded: dict[str, Any] = yaml.safe_load(_V1_DOCUMENT.read_text())
    return loaded


def _api_base(request: HttpRequest) -> str:
    return request.build_absolute_uri("/v1")


@require_GET
def landing(request: HttpRequest) -> HttpResponse:
    return render(request, "landing.html", {"api_base": _api_base(request)})


@require_GET
def prices(request: HttpRequest) -> HttpResponse:
    """The public price list: what a visitor needs before signing up (no endpoints, no workers named)."""
    return render(request, "prices.html", {"models": models_for_customers()})


@require_GET
def docs(request: HttpRequest) -> HttpResponse:
    return render(request, "docs/index.html", {"api_base": _api_base(request)})


@require_GET
def v1_openapi(request: HttpRequest) -> JsonResponse:
    return JsonResponse(v1_document())


@require_GET
def v1_redoc(request: HttpRequest) -> HttpResponse:
    return render(request, "docs/redoc.html", {"title": "SpeedInfer /v1 API", "schema_url": "/docs/v1.json"})
