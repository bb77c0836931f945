"""The customer dashboard: a signed-in user sees and changes only their own account."""

from __future__ import annotations

import csv
import functools
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, TypeVar

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, StreamingHttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from accounts.models import POWER_BUDGETS, POWER_KEYS, POWER_USAGE, Account, ApiKey
from accounts.selectors import membership_for_user
from accounts.services import api_key_create, api_key_revoke, api_key_set_budget
from console.dashboard.forms import ApiKeyCreateForm, KeyBudgetForm, UsageRangeForm
from console.dashboard.selectors import (
    api_keys_with_spend,
    dashboard_summary,
    models_for_customers,
    refused_requests,
    usage_by_day_and_model,
    usage_records,
    usage_records_iter,
)
from core.credits import display_credits, format_credits

RECENT_ROWS = 50


R = TypeVar("R", bound=HttpResponse | StreamingHttpResponse)


def member_view(power: str) -> Callable[[Callable[..., R]], Callable[..., R | HttpResponse]]:
    """Sign-in required, then the signed-in member's own account as the view's second argument, when
    their role has `power` (accounts.models.ROLE_POWERS); otherwise 403. A user with no account (staff,
    say, or a member just removed) gets the 403 "no account" page. The membership is read on every
    request, so a removal or a role change applies to the member's very next request."""

    def decorate(view: Callable[..., R]) -> Callable[..., R | HttpResponse]:
        @login_required
        @functools.wraps(view)
        def with_account(request: HttpRequest, *args: Any, **kwargs: Any) -> R | HttpResponse:
            membership = membership_for_user(user=request.user)
            if membership is None:
                return render(request, "dashboard/no_account.html", status=403)
            request.membership = membership  # type: ignore[attr-defined]  # for the templates' nav and buttons
            if not membership.can(power):
                context = {"account": membership.account, "membership": membership, "power": power}
                return render(request, "dashboard/forbidden.html", context, status=403)
            return view(request, membership.account, *args, **kwargs)

        return with_account

    return decorate


def customer_view(view: Callable[..., R]) -> Callable[..., R | HttpResponse]:
    """A page every member may see (usage); see member_view."""
    return member_view(POWER_USAGE)(view)


@require_GET
@customer_view
def home(request: HttpRequest, account: Account) -> HttpResponse:
    summary = dashboard_summary(account=account)
    recent = list(usage_records(account=account)[:10])
    today = timezone.now().date()
    refused = refused_requests(account=account, start=today - timedelta(days=6), end=today)
    context = {"account": account, "summary": summary, "recent": recent, "refused": refused}
    return render(request, "dashboard/home.html", context)


def _chart_data(rows: list[Any], start: Any, end: Any) -> dict[str, Any]:
    """Per-day series per model, for Chart.js; days without usage are zeros."""
    days = [start + timedelta(days=i) for i in range((end - start).days + 1)]
    index = {day: i for i, day in enumerate(days)}
    tokens: dict[str, list[int]] = {}
    cost: dict[str, list[float]] = {}
    for row in rows:
        i = index.get(row.day)
        if i is None:
            continue
        tokens.setdefault(row.model_id, [0] * len(days))[i] += row.tokens
        # Charts plot floats; exact amounts are in the table and CSV.
        cost.setdefault(row.model_id, [0.0] * len(days))[i] += float(format_credits(row.cost))
    return {"days": [d.isoformat() for d in days], "tokens": tokens, "cost": cost}


@require_GET
@customer_view
def usage(request: HttpRequest, account: Account) -> HttpResponse:
    form = UsageRangeForm(request.GET or None)
    start, end = form.range()
    rows = usage_by_day_and_model(account=account, start=start, end=end)
    per_model: dict[str, dict[str, int]] = {}
    for row in rows:
        totals = per_model.setdefault(row.model_id, {"requests": 0, "prompt": 0, "completion": 0, "cost": 0})
        totals["requests"] += row.requests
        totals["prompt"] += row.prompt_tokens
        totals["completion"] += row.completion_tokens
        totals["cost"] += row.cost
    context = {
        "account": account,
        "form": form,
        "start": start,
        "end": end,
        "per_model": sorted(per_model.items()),
        "chart": _chart_data(rows, start, end),
        "recent": list(usage_records(account=account, start=start, end=end)[:RECENT_ROWS]),
        "refused": refused_requests(account=account, start=start, end=end),
        "csv_query": f"start={start.isoformat()}&end={end.isoformat()}",
    }
    return render(request, "dashboard/usage.html", context)


class _Echo:
    def write(self, value: str) -> str:
        return value


CSV_HEADER = [
    "created_at",
    "request_id",
    "key",
    "model",
    "endpoint",
    "status",
    "error_code",
    "prompt_tokens",
    "completion_tokens",
    "cost_credits",
    "latency_ms",
    "ttft_ms",
    "streamed",
    "cached_tokens",
    "reasoning_tokens",
]


def usage_csv_rows(records: Iterator[Any]) -> Iterator[list[Any]]:
    yield CSV_HEADER
    for r in records:
        yield [
            r.created_at.isoformat(),
            r.request_id,
            r.api_key.prefix if r.api_key else "",
            r.model_id,
            r.endpoint,
            r.status,
            r.error_code,
            r.prompt_tokens,
            r.completion_tokens,
            format_credits(r.cost),
            r.latency_ms,
            "" if r.ttft_ms is None else r.ttft_ms,
            "yes" if r.streamed else "no",
            r.cached_tokens,
            r.reasoning_tokens,
        ]


@require_GET
@customer_view
def usage_csv(request: HttpRequest, account: Account) -> HttpResponse | StreamingHttpResponse:
    start, end = UsageRangeForm(request.GET or None).range()
    writer = csv.writer(_Echo())
    body = (writer.writerow(row) for row in usage_csv_rows(usage_records_iter(account=account, start=start, end=end)))
    response = StreamingHttpResponse(body, content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="usage-{start}-{end}.csv"'
    return response


@member_view(POWER_KEYS)
def keys(request: HttpRequest, account: Account) -> HttpResponse:
    may_budget = request.membership.can(POWER_BUDGETS)  # type: ignore[attr-defined]
    if request.method == "POST" and not may_budget and (request.POST.get("budget") or "").strip():
        return _forbidden(request, account, POWER_BUDGETS)
    form = ApiKeyCreateForm(request.POST or None)
    if not may_budget:
        form.fields.pop("budget")
    if request.method == "POST" and form.is_valid():
        try:
            created = api_key_create(
                account=account,
                name=form.cleaned_data["name"],
                scopes=form.cleaned_data["scopes"],
                allowed_models=form.cleaned_data["allowed_models"],
                expires_at=form.cleaned_data["expires"],
                monthly_budget=form.cleaned_data.get("budget"),
                priority=form.cleaned_data["priority"],
                actor=request.user,
                via="dashboard",
            )
        except ValidationError as exc:
            for message in exc.messages:
                form.add_error(None, message)
        else:
            # Post/redirect/get: the secret waits in this user's server-side session for the one GET
            # that shows it and pops it, so a reload neither creates a second key nor shows it again.
            request.session[_CREATED_SESSION_KEY] = {"key_id": created.api_key.pk, "secret": created.secret}
            return HttpResponseRedirect(reverse("dashboard:key_created"))
    status = 400 if request.method == "POST" else 200
    context = {"account": account, "form": form, "keys": api_keys_with_spend(account=account)}
    return render(request, "dashboard/keys.html", context, status=status)


_CREATED_SESSION_KEY = "dashboard_created_key"


def _forbidden(request: HttpRequest, account: Account, power: str) -> HttpResponse:
    context = {"account": account, "membership": request.membership, "power": power}  # type: ignore[attr-defined]
    return render(request, "dashboard/forbidden.html", context, status=403)


@require_GET
@member_view(POWER_KEYS)
def key_created(request: HttpRequest, account: Account) -> HttpResponse:
    shown = request.session.pop(_CREATED_SESSION_KEY, None)
    api_key = ApiKey.objects.filter(pk=shown["key_id"], account=account).first() if shown else None
    if api_key is None:
        messages.info(
            request, "That key's secret was shown once and is not shown again. Create a new key if you lost it."
        )
        return HttpResponseRedirect(reverse("dashboard:keys"))
    context = {"account": account, "created": {"api_key": api_key, "secret": shown["secret"]}}
    response = render(request, "dashboard/key_created.html", context)
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@member_view(POWER_BUDGETS)
def key_budget(request: HttpRequest, account: Account, key_id: int) -> HttpResponse:
    api_key = get_object_or_404(ApiKey, pk=key_id, account=account)
    form = KeyBudgetForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"{api_key.name}: {form.errors['budget'][0]}")
    else:
        budget = form.cleaned_data["budget"]
        api_key_set_budget(api_key=api_key, monthly_budget=budget, actor=request.user, via="dashboard")
        what = f"a budget of {display_credits(budget)} credits a month" if budget else "no budget"
        messages.success(request, f"{api_key.name} now has {what}.")
    return HttpResponseRedirect(reverse("dashboard:keys"))


@require_GET
@customer_view
def models(request: HttpRequest, account: Account) -> HttpResponse:
    return render(request, "dashboard/models.html", {"account": account, "models": models_for_customers()})


@require_POST
@member_view(POWER_KEYS)
def key_revoke(request: HttpRequest, account: Account, key_id: int) -> HttpResponse:
    api_key = get_object_or_404(ApiKey, pk=key_id, account=account)
    if api_key.revoked_at is None:
        api_key_revoke(api_key=api_key, actor=request.user, via="dashboard")
        messages.success(request, f"Revoked {api_key.name} ({api_key.prefix}).")
    return HttpResponseRedirect(reverse("dashboard:keys"))
