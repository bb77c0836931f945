"""Sign-in throttling for the dashboard's and the admin's login forms (django-axes)."""

from __future__ import annotations

from typing import Any

from axes.backends import AxesStandaloneBackend
from django.http import HttpRequest


class LoginThrottleBackend(AxesStandaloneBackend):
    """django-axes' lockout check, first in AUTHENTICATION_BACKENDS.

    Axes refuses an authenticate() call without a request; sign-ins without one
    (Django's test client login, a shell) are not a web form anyone can hammer,
    so they pass straight to the next backend instead of failing.
    """

    def authenticate(
        self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kwargs: Any
    ) -> None:
        if request is None:
            return None
        super().authenticate(request, username=username, password=password, **kwargs)
        return None
