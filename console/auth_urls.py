"""/accounts/: sign-in, sign-out, password change; password reset only when configured.

Django's stock reset view builds its links from the request's Host header, which with
ALLOWED_HOSTS=* an attacker chooses; here the links use SPEEDINFER_PUBLIC_URL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import PasswordResetForm
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.http.response import HttpResponseBase
from django.urls import URLPattern, path

from console.dashboard.members import accept as invitation_accept


def _reset_view(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        # Off unless SPEEDINFER_PASSWORD_RESET=1 (with EMAIL_* and SPEEDINFER_PUBLIC_URL set).
        if not settings.SPEEDINFER_PASSWORD_RESET:
            raise Http404("password reset is not enabled")
        return view(request, *args, **kwargs)

    return guarded


class _PublicUrlPasswordReset(auth_views.PasswordResetView):
    """Django's reset view, with the email's links on SPEEDINFER_PUBLIC_URL."""

    def form_valid(self, form: PasswordResetForm) -> HttpResponse:
        public = urlsplit(settings.SPEEDINFER_PUBLIC_URL)
        form.save(
            domain_override=public.netloc,
            use_https=public.scheme == "https",
            token_generator=self.token_generator,
            from_email=self.from_email,
            email_template_name=self.email_template_name,
            subject_template_name=self.subject_template_name,
            request=self.request,
            html_email_template_name=self.html_email_template_name,
            extra_email_context=dict(self.extra_email_context or {}),
        )
        return HttpResponseRedirect(self.get_success_url())


urlpatterns: list[URLPattern] = [
    path("invite/<str:token>/", invitation_accept, name="invitation_accept"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("password_change/", auth_views.PasswordChangeView.as_view(), name="password_change"),
    path("password_change/done/", auth_views.PasswordChangeDoneView.as_view(), name="password_change_done"),
    path("password_reset/", _reset_view(_PublicUrlPasswordReset.as_view()), name="password_reset"),
    path(
        "password_reset/done/",
        _reset_view(auth_views.PasswordResetDoneView.as_view()),
        name="password_reset_done",
    ),
    path(
        "reset/<uidb64>/<token>/",
        _reset_view(auth_views.PasswordResetConfirmView.as_view()),
        name="password_reset_confirm",
    ),
    path("reset/done/", _reset_view(auth_views.PasswordResetCompleteView.as_view()), name="password_reset_complete"),
]
