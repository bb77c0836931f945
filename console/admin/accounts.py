"""Staff admin for accounts, API keys and the audit log.

Money is never an editable field: balances change only through the grant form,
which calls billing.services.credits_grant. Key secrets are shown once, on the
page that answers the create form; only their digests are stored.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.widgets import AdminSplitDateTime
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from accounts.models import DEFAULT_SCOPES, SCOPES, Account, ApiKey, Membership
from accounts.services import (
    account_ceilings_set,
    account_create,
    api_key_create,
    api_key_revoke,
    api_key_update,
)
from billing.services import InsufficientCredits, InvalidAmount, credits_grant
from catalog.models import PublicModel
from core.credits import MICRO, format_credits
from core.models import AuditLog


class GrantCreditsForm(forms.Form):
    amount = forms.DecimalField(
        max_digits=18,
        decimal_places=6,
        help_text="Credits, up to 6 decimals. Negative removes credits (never below zero available).",
    )
    note = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), help_text="Required: why, for the ledger.")

    def clean_amount(self) -> int:
        amount: Decimal = self.cleaned_data["amount"]
        micro = int(amount * MICRO)
        if micro == 0:
            raise ValidationError("Must not be zero.")
        return micro

    def clean_note(self) -> str:
        note = str(self.cleaned_data["note"]).strip()
        if not note:
            raise ValidationError("A note is required.")
        return note


def grant_to_accounts(request: HttpRequest, accounts: list[Account], *, amount: int, note: str) -> int:
    """Grant to each account in its own transaction; returns how many succeeded."""
    granted = 0
    for account in accounts:
        try:
            # credits_grant commits its own durable transaction (it may not nest), and
            # its ledger row already names the actor and note; the audit row follows it.
            credits_grant(account=account, amount=amount, actor=request.user, note=note, via="admin")
        except (InsufficientCredits, InvalidAmount) as exc:
            messages.error(request, f"{account.name}: {exc}")
            continue
        granted += 1
    return granted


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    fields = ("user", "created_at")
    readonly_fields = ("created_at",)
    raw_id_fields = ("user",)


@admin.register(Account)
class AccountAdmin(admin.ModelAdmin):
    list_display = ("name", "balance", "reserved_credits", "key_count", "created_at")
    search_fields = ("name",)
    fields = ("name", "balance", "reserved_credits", "rpm_ceiling", "tpm_ceiling", "created_at", "grant_link")
    readonly_fields = ("balance", "reserved_credits", "created_at", "grant_link")
    inlines = [MembershipInline]
    actions = ["grant_credits"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Account]:
        from django.db.models import Count

        return super().get_queryset(request).annotate(_keys=Count("api_keys"))

    def get_readonly_fields(self, request: HttpRequest, obj: Account | None = None) -> tuple[str, ...]:
        # The name is the account's identity in commands and the ledger: set once.
        return (*self.readonly_fields, "name") if obj else self.readonly_fields

    def get_fields(self, request: HttpRequest, obj: Account | None = None) -> tuple[str, ...]:
        return self.fields if obj else ("name",)

    @admin.display(description="Balance (credits)")
    def balance(self, obj: Account) -> str:
        return format_credits(obj.available)

    @admin.display(description="Reserved (credits)")
    def reserved_credits(self, obj: Account) -> str:
        return format_credits(obj.reserved)

    @admin.display(description="Keys")
    def key_count(self, obj: Account) -> int:
        return int(getattr(obj, "_keys", 0))

    @admin.display(description="Credits")
    def grant_link(self, obj: Account) -> str:
        if not obj.pk:
            return ""
        url = reverse("admin:accounts_account_grant", args=[obj.pk])
        ledger = reverse("admin:billing_ledgerentry_changelist") + f"?account__id__exact={obj.pk}"
        return format_html('<a class="button" href="{}">Grant credits</a> &nbsp; <a href="{}">Ledger</a>', url, ledger)

    def save_model(self, request: HttpRequest, obj: Account, form: Any, change: bool) -> None:
        if change:
            # Only the key ceilings are editable here; they go through the service (audit, key cache).
            account_ceilings_set(
                account=obj,
                rpm_ceiling=form.cleaned_data.get("rpm_ceiling"),
                tpm_ceiling=form.cleaned_data.get("tpm_ceiling"),
                actor=request.user,
                via="admin",
            )
            return
        created = account_create(name=obj.name, actor=request.user, via="admin")
        obj.pk = created.pk
        obj.created_at = created.created_at

    def get_urls(self) -> list[URLPattern]:
        custom = [
            path(
                "<int:account_id>/grant/",
                self.admin_site.admin_view(self.grant_view),
                name="accounts_account_grant",
            )
        ]
        return custom + super().get_urls()

    def _grant_page(
        self, request: HttpRequest, accounts: list[Account], form: GrantCreditsForm, *, via_action: bool
    ) -> TemplateResponse:
        context = {
            **self.admin_site.each_context(request),
            "title": "Grant credits",
            "accounts": accounts,
            "form": form,
            "opts": self.model._meta,
            "via_action": via_action,
            "selected": [a.pk for a in accounts],
        }
        return TemplateResponse(request, "admin/accounts/account/grant_credits.html", context)

    def grant_view(self, request: HttpRequest, account_id: int) -> HttpResponse:
        if not self.has_change_permission(request):
            raise PermissionDenied
        account = get_object_or_404(Account, pk=account_id)
        form = GrantCreditsForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            amount, note = form.cleaned_data["amount"], form.cleaned_data["note"]
            if grant_to_accounts(request, [account], amount=amount, note=note):
                messages.success(request, f"Granted {format_credits(amount)} credits to {account.name}.")
            return HttpResponseRedirect(reverse("admin:accounts_account_change", args=[account.pk]))
        return self._grant_page(request, [account], form, via_action=False)

    @admin.action(description="Grant credits to the selected accounts", permissions=["change"])
    def grant_credits(self, request: HttpRequest, queryset: QuerySet[Account]) -> TemplateResponse | None:
        accounts = list(queryset)
        form = GrantCreditsForm(request.POST if "apply" in request.POST else None)
        if "apply" in request.POST and form.is_valid():
            amount, note = form.cleaned_data["amount"], form.cleaned_data["note"]
            granted = grant_to_accounts(request, accounts, amount=amount, note=note)
            if granted:
                messages.success(request, f"Granted {format_credits(amount)} credits to {granted} account(s).")
            return None
        return self._grant_page(request, accounts, form, via_action=True)


def _model_choices() -> list[tuple[str, str]]:
    return [(m, m) for m in PublicModel.objects.values_list("model_id", flat=True)]


class ApiKeyForm(forms.ModelForm):
    """Scopes as checkboxes and the model allow-list as a multi-select, for create and edit."""

    scopes = forms.MultipleChoiceField(
        choices=[(s, s) for s in SCOPES],
        widget=forms.CheckboxSelectMultiple,
        initial=list(DEFAULT_SCOPES),
    )
    allowed_models = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Allowed models",
        help_text="None ticked: every model.",
    )
    expires_at = forms.SplitDateTimeField(required=False, widget=AdminSplitDateTime, label="Expires at (UTC)")

    class Meta:
        model = ApiKey
        fields = ("account", "name", "scopes", "allowed_models", "rpm", "tpm", "expires_at")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["allowed_models"].choices = _model_choices()  # type: ignore[attr-defined]
        self.fields["name"].required = False


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    form = ApiKeyForm
    list_display = (
        "name",
        "prefix_display",
        "account",
        "scope_list",
        "model_list",
        "last_used_at",
        "expires_at",
        "state",
    )
    list_select_related = ("account",)
    list_filter = ("revoked_at", "expires_at")
    search_fields = ("name", "lookup_id", "account__name")
    readonly_fields = ("prefix_display", "digest", "last_used_at", "revoked_at", "created_at")
    actions = ["revoke_keys"]
    autocomplete_fields = ("account",)

    def get_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> tuple[str, ...]:
        editable = ("name", "scopes", "allowed_models", "rpm", "tpm", "expires_at")
        if obj is None:
            return ("account", *editable)
        return ("account", "prefix_display", *editable, "digest", "last_used_at", "revoked_at", "created_at")

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> tuple[str, ...]:
        if obj is None:
            return ()
        if obj.revoked_at is not None:
            # A revoked key is history: nothing on it changes.
            return (*self.readonly_fields, "account", "name", "scopes", "allowed_models", "rpm", "tpm", "expires_at")
        return (*self.readonly_fields, "account")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[ApiKey], search_term: str
    ) -> tuple[QuerySet[ApiKey], bool]:
        # Staff paste the displayed prefix (sk-si-xxxxxxxxxxxx); the column holds the part after it.
        return super().get_search_results(request, queryset, search_term.strip().removeprefix("sk-si-"))

    @admin.display(description="Prefix", ordering="lookup_id")
    def prefix_display(self, obj: ApiKey) -> str:
        return obj.prefix if obj.lookup_id else "-"

    @admin.display(description="Scopes")
    def scope_list(self, obj: ApiKey) -> str:
        return ", ".join(obj.scopes)

    @admin.display(description="Models")
    def model_list(self, obj: ApiKey) -> str:
        return ", ".join(obj.allowed_models) or "all"

    @admin.display(description="State")
    def state(self, obj: ApiKey) -> str:
        from django.utils import timezone

        if obj.revoked_at:
            return "revoked"
        if obj.expires_at and obj.expires_at <= timezone.now():
            return "expired"
        return "active"

    def has_delete_permission(self, request: HttpRequest, obj: ApiKey | None = None) -> bool:
        return False  # revoke instead: usage rows keep pointing at the key

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        data = form.cleaned_data
        with transaction.atomic():
            if change:
                api_key_update(
                    api_key=obj,
                    name=data["name"],
                    scopes=data["scopes"],
                    allowed_models=data["allowed_models"],
                    rpm=data["rpm"],
                    tpm=data["tpm"],
                    expires_at=data["expires_at"],
                    actor=request.user,
                    via="admin",
                )
                return
            created = api_key_create(
                account=data["account"],
                name=data["name"],
                scopes=data["scopes"],
                allowed_models=data["allowed_models"],
                rpm=data["rpm"],
                tpm=data["tpm"],
                expires_at=data["expires_at"],
                actor=request.user,
                via="admin",
            )
        obj.pk = created.api_key.pk
        obj.lookup_id = created.api_key.lookup_id
        request._created_secret = created.secret  # type: ignore[attr-defined]

    def response_add(self, request: HttpRequest, obj: ApiKey, post_url_continue: str | None = None) -> HttpResponse:
        secret = getattr(request, "_created_secret", None)
        if secret is None:
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "title": "API key created",
            "opts": self.model._meta,
            "api_key": obj,
            "secret": secret,
        }
        response = TemplateResponse(request, "admin/accounts/apikey/created.html", context)
        response["Cache-Control"] = "no-store"
        return response

    def _changeform_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        # A service's ValidationError (unknown model, bad scope) is shown on the form, not a 500.
        try:
            return super()._changeform_view(request, *args, **kwargs)  # type: ignore[misc]
        except ValidationError as exc:
            messages.error(request, "; ".join(exc.messages))
            return HttpResponseRedirect(request.get_full_path())

    @admin.action(description="Revoke the selected keys", permissions=["change"])
    def revoke_keys(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        revoked = 0
        for api_key in queryset.filter(revoked_at__isnull=True):
            api_key_revoke(api_key=api_key, actor=request.user, via="admin")
            revoked += 1
        messages.success(request, f"Revoked {revoked} key(s).")


@admin.register(AuditLog)
class AuditLogAdmin(admin.ModelAdmin):
    list_display = ("created_at", "actor", "action", "target_repr", "detail")
    list_filter = ("action", "target_type", ("created_at", admin.DateFieldListFilter))
    search_fields = ("actor", "target_repr", "target_id")
    date_hierarchy = "created_at"
    readonly_fields = ("created_at", "actor", "action", "target_type", "target_id", "target_repr", "detail")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: AuditLog | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: AuditLog | None = None) -> bool:
        return False
