"""Django's 500 handler: a database outage is a 503 page that says so (the dashboard's and the admin's
counterpart of /v1's 503 service_unavailable), any other failure Django's own 500 page."""

from __future__ import annotations

import logging
import sys

from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string
from django.views import defaults

from core.outages import DB_ERRORS, DatabaseUnavailable

log = logging.getLogger("speedinfer.console")

RETRY_AFTER_S = 5


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: Django calls it inside its `except`, so the failure is in sys.exc_info()."""
    exc = sys.exc_info()[1]
    if not isinstance(exc, (*DB_ERRORS, DatabaseUnavailable)):
        return defaults.server_error(request)
    log.warning("%s %s: database unreachable: %s", request.method, request.path, exc)
    # A page of its own, no base.html: the top bar asks for the signed-in user, which is a query.
    response = HttpResponse(render_to_string("503.html", {"retry_after": RETRY_AFTER_S}), status=503)
    response["Retry-After"] = str(RETRY_AFTER_S)
    response["Cache-Control"] = "no-store"
    return response
