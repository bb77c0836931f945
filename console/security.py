"""Why a sign-in form was refused: the CSRF failure page says what to change, not a bare 403."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string

HTTPS_REQUIRED = (
    "This site requires HTTPS for sign-in: its cookies are Secure, so a browser on plain HTTP never sends them back. "
    "Use https://, or set SPEEDINFER_SECURE_COOKIES=0 for plain HTTP in a trusted network."
)
EXPIRED = "The form was too old or cookies are blocked. Reload the page, allow cookies for this site and try again."


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """CSRF_FAILURE_VIEW: the same 403, with the one reason a person can act on."""
    insecure = not request.is_secure() and (settings.CSRF_COOKIE_SECURE or settings.SESSION_COOKIE_SECURE)
    message = HTTPS_REQUIRED if insecure else EXPIRED
    html = render_to_string("registration/csrf_failure.html", {"message": message}, request=request)
    return HttpResponse(html, status=403)
