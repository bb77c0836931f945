"""The dashboard's members page (owners) and the invitation link (anyone holding it)."""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login
from django.core.exceptions import ValidationError
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from accounts.models import POWER_MEMBERS, Account, Invitation, Role
from accounts.selectors import invitations_pending, members_of_account, membership_in_account
from accounts.services import (
    INVITATION_TTL,
    InvitationInvalid,
    invitation_accept,
    invitation_create,
    invitation_from_token,
    invitation_revoke,
    invitation_send,
    member_remove,
    member_set_role,
)
from console.dashboard.views import member_view


class InviteForm(forms.Form):
    email = forms.EmailField(help_text="They get a link to set a password; it works once, for 7 days.")
    role = forms.ChoiceField(choices=Role.choices, initial=Role.DEVELOPER)


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)


class AcceptForm(forms.Form):
    password = forms.CharField(widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}))


def _errors_text(exc: ValidationError) -> str:
    return "; ".join(exc.messages)


def _members_page(request: HttpRequest, account: Account, form: InviteForm, *, status: int = 200) -> HttpResponse:
    context = {
        "account": account,
        "members": members_of_account(account=account),
        "invitations": invitations_pending(account=account),
        "form": form,
        "roles": Role.choices,
    }
    return render(request, "dashboard/members.html", context, status=status)


@member_view(POWER_MEMBERS)
def members(request: HttpRequest, account: Account) -> HttpResponse:
    if request.method != "POST":
        return _members_page(request, account, InviteForm())
    form = InviteForm(request.POST)
    if not form.is_valid():
        return _members_page(request, account, form, status=400)
    try:
        created = invitation_create(
            account=account,
            email=form.cleaned_data["email"],
            role=form.cleaned_data["role"],
            actor=request.user,
            via="dashboard",
        )
    except ValidationError as exc:
        form.add_error("email", _errors_text(exc))
        return _members_page(request, account, form, status=400)
    path = reverse("invitation_accept", args=[created.token])
    # SPEEDINFER_PUBLIC_URL when set (as for password reset); otherwise the owner's own request's host.
    public = settings.SPEEDINFER_PUBLIC_URL
    url = f"{public}{path}" if public else request.build_absolute_uri(path)
    # Mail goes out after the invitation's transaction committed, never inside it.
    transaction.on_commit(lambda: invitation_send(invitation=created.invitation, accept_url=url))
    messages.success(request, f"Invited {created.invitation.email} as {created.invitation.role}.")
    return HttpResponseRedirect(reverse("dashboard:members"))


@require_POST
@member_view(POWER_MEMBERS)
def member_role(request: HttpRequest, account: Account, membership_id: int) -> HttpResponse:
    membership = membership_in_account(account=account, membership_id=membership_id)
    if membership is None:
        raise Http404("no such member")
    form = RoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose owner, developer or viewer.")
    else:
        try:
            member_set_role(membership=membership, role=form.cleaned_data["role"], actor=request.user, via="dashboard")
        except ValidationError as exc:
            messages.error(request, _errors_text(exc))
        else:
            messages.success(request, f"{membership.user.get_username()} is now a {membership.role}.")
    return HttpResponseRedirect(reverse("dashboard:members"))


@require_POST
@member_view(POWER_MEMBERS)
def member_remove_view(request: HttpRequest, account: Account, membership_id: int) -> HttpResponse:
    membership = membership_in_account(account=account, membership_id=membership_id)
    if membership is None:
        raise Http404("no such member")
    try:
        member_remove(membership=membership, actor=request.user, via="dashboard")
    except ValidationError as exc:
        messages.error(request, _errors_text(exc))
    else:
        messages.success(request, f"Removed {membership.user.get_username()}.")
    return HttpResponseRedirect(reverse("dashboard:members"))


@require_POST
@member_view(POWER_MEMBERS)
def invitation_revoke_view(request: HttpRequest, account: Account, invitation_id: int) -> HttpResponse:
    invitation = Invitation.objects.filter(account=account, pk=invitation_id).first()
    if invitation is None:
        raise Http404("no such invitation")
    invitation_revoke(invitation=invitation, actor=request.user, via="dashboard")
    messages.success(request, f"Withdrew the invitation to {invitation.email}.")
    return HttpResponseRedirect(reverse("dashboard:members"))


@never_cache
def accept(request: HttpRequest, token: str) -> HttpResponse:
    """The emailed link: shows whom the invitation is for; a POST sets the password (or, for an existing
    login, checks it), joins the account and signs in."""
    try:
        invitation = invitation_from_token(token=token)
    except InvitationInvalid as exc:
        return render(request, "registration/invitation.html", {"problem": str(exc)}, status=410)
    from django.contrib.auth import get_user_model

    existing = get_user_model().objects.filter(username=invitation.email).exists()
    form = AcceptForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            membership = invitation_accept(token=token, password=form.cleaned_data["password"])
        except InvitationInvalid as exc:
            return render(request, "registration/invitation.html", {"problem": str(exc)}, status=410)
        except ValidationError as exc:
            form.add_error("password", _errors_text(exc))
        else:
            login(request, membership.user, backend="django.contrib.auth.backends.ModelBackend")
            messages.success(request, f"Welcome to {membership.account.name}.")
            return HttpResponseRedirect(reverse("dashboard:home"))
    context = {"invitation": invitation, "form": form, "existing": existing, "days": INVITATION_TTL.days}
    status = 400 if request.method == "POST" else 200
    return render(request, "registration/invitation.html", context, status=status)
