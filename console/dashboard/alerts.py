"""The dashboard's spend alert settings: the account's owners only; the signing secret shown once."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse

from accounts.models import Account
from accounts.selectors import user_is_account_owner
from alerts.selectors import alert_deliveries_for, alert_settings_for
from alerts.services import alert_settings_set
from console.dashboard.forms import AlertSettingsForm
from console.dashboard.views import customer_view
from core.credits import format_credits

_SECRET_SESSION_KEY = "dashboard_alert_secret"  # noqa: S105 - a session key name
_FIELD = {"low_balance": "low_balance", "webhook": "webhook_url", "budget_percent": "budget_percents"}


def _initial(account: Account) -> dict[str, object]:
    row = alert_settings_for(account=account)
    if row is None:
        return {}
    return {
        "low_balance": format_credits(row.low_balance).rstrip("0").rstrip(".") if row.low_balance else "",
        "webhook_url": row.webhook_url,
        "budget_percents": ", ".join(str(p) for p in row.budget_percents),
    }


@customer_view
def alerts(request: HttpRequest, account: Account) -> HttpResponse:
    if not user_is_account_owner(user=request.user, account=account):
        # The dashboard's own 403 page (nav, role, a way back), not Django's bare "403 Forbidden".
        context = {"account": account, "membership": request.membership, "power": "alerts"}  # type: ignore[attr-defined]
        return render(request, "dashboard/forbidden.html", context, status=403)
    if request.method not in ("GET", "HEAD", "POST"):
        return HttpResponse(status=405)
    form = AlertSettingsForm(request.POST or None, initial=_initial(account))
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            change = alert_settings_set(
                account=account,
                low_balance=data["low_balance"],
                webhook_url=data["webhook_url"],
                budget_percents=data["budget_percents"],
                rotate_secret=data["rotate_secret"],
                actor=request.user,
                via="dashboard",
            )
        except ValidationError as exc:
            for field, errors in exc.error_dict.items():
                for error in errors:
                    form.add_error(_FIELD.get(field), error.messages[0])
        else:
            if change.secret:
                # Post/redirect/get, as for a new key: the secret waits in the session for one GET.
                request.session[_SECRET_SESSION_KEY] = change.secret
            return HttpResponseRedirect(reverse("dashboard:alerts") + "?saved=1")
    secret = request.session.pop(_SECRET_SESSION_KEY, None) if request.method == "GET" else None
    context = {
        "account": account,
        "form": form,
        "secret": secret,
        "saved": request.GET.get("saved") == "1" and request.method == "GET",
        "deliveries": list(alert_deliveries_for(account=account)),
    }
    response = render(request, "dashboard/alerts.html", context, status=400 if request.method == "POST" else 200)
    if secret:
        response["Cache-Control"] = "no-store"
    return response
