"""Staff admin for accounts, API keys and the audit log.

Money is never an editable field: balances change only through the grant form,
which calls billing.services.credits_grant. Key secrets are shown once, on the
page that answers the create form; only their digests are stored.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.widgets import AdminSplitDateTime
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode

from accounts.models import DEFAULT_SCOPES, SCOPES, Account, ApiKey, Invitation, Membership
from accounts.services import (
    account_ceilings_set,
    account_create,
    account_user_create,
    api_key_create,
    api_key_revoke,
    api_key_set_budget,
    api_key_set_priority,
    api_key_update,
    invitation_revoke,
    member_add,
    member_remove,
    member_set_role,
)
from alerts.models import AlertSettings
from billing.ledger import month_start
from billing.models import KeySpend
from billing.services import InsufficientCredits, InvalidAmount, credits_grant
from catalog.models import PublicModel
from core.credits import MICRO, AmountError, display_credits, format_credits, parse_credits
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
            messages.error(request, f"Account {account.name}: {exc}")
            continue
        granted += 1
    return granted


class AccountAddForm(forms.ModelForm):
    """Adding an account may also create its owner's dashboard login (email and password)."""

    owner_email = forms.EmailField(required=False, label="Owner email", help_text="Optional: the dashboard login.")
    owner_password = forms.CharField(
        required=False, widget=forms.PasswordInput, min_length=8, label="Owner password", help_text="At least 8."
    )

    class Meta:
        model = Account
        fields = ("name",)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if cleaned.get("owner_email") and not cleaned.get("owner_password"):
            self.add_error("owner_password", "Required with an owner email.")
        return cleaned


class MembershipInline(admin.TabularInline):
    """The account's members and roles. Saved through accounts.services (audited, last owner kept)."""

    model = Membership
    extra = 0
    fields = ("user", "role", "created_at")
    readonly_fields = ("created_at",)
    raw_id_fields = ("user",)


def save_membership_formset(request: HttpRequest, account: Account, formset: Any) -> None:
    """Adds, role changes and removals from the inline, each through its service."""
    # What the admin's change message reads (ModelFormSet.save() would have set these).
    formset.new_objects, formset.changed_objects, formset.deleted_objects = [], [], []
    for form in formset.deleted_forms:
        if form.instance.pk:
            member_remove(membership=form.instance, actor=request.user, via="admin")
            formset.deleted_objects.append(form.instance)
    for form in formset.forms:
        if form in formset.deleted_forms or not form.has_changed():
            continue
        membership: Membership = form.instance
        if membership.pk is None:
            change = member_add(
                account=account,
                email=membership.user.get_username(),
                role=form.cleaned_data["role"],
                actor=request.user,
                via="admin",
            )
            formset.new_objects.append(change.membership)
        else:
            member_set_role(membership=membership, role=form.cleaned_data["role"], actor=request.user, via="admin")
            formset.changed_objects.append((membership, form.changed_data))


@admin.register(Account)
class AccountAdmin(admin.ModelAdmin):
    list_display = ("name", "balance", "reserved_credits", "key_count", "created_at")
    search_fields = ("name",)
    fields = (
        "name",
        "balance",
        "reserved_credits",
        "rpm_ceiling",
        "tpm_ceiling",
        "created_at",
        "grant_link",
        "alerts_link",
    )
    readonly_fields = ("balance", "reserved_credits", "created_at", "grant_link", "alerts_link")
    inlines = [MembershipInline]
    actions = ["grant_credits"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Account]:
        from django.db.models import Count

        return super().get_queryset(request).annotate(_keys=Count("api_keys"))

    def get_readonly_fields(self, request: HttpRequest, obj: Account | None = None) -> tuple[str, ...]:
        # The name is the account's identity in commands and the ledger: set once.
        return (*self.readonly_fields, "name") if obj else self.readonly_fields

    def get_fields(self, request: HttpRequest, obj: Account | None = None) -> tuple[str, ...]:
        return self.fields if obj else ("name", "owner_email", "owner_password")

    def get_form(self, request: HttpRequest, obj: Account | None = None, change: bool = False, **kwargs: Any) -> Any:
        if obj is None:
            kwargs["form"] = AccountAddForm
        return super().get_form(request, obj, change=change, **kwargs)

    @admin.display(description="Balance (credits)")
    def balance(self, obj: Account) -> str:
        return display_credits(obj.available)

    @admin.display(description="Reserved (credits)")
    def reserved_credits(self, obj: Account) -> str:
        return display_credits(obj.reserved)

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

    @admin.display(description="Spend alerts")
    def alerts_link(self, obj: Account) -> str:
        row = AlertSettings.objects.filter(account=obj).first() if obj.pk else None
        if row is None:
            url = reverse("admin:alerts_alertsettings_add") + f"?account={obj.pk}"
            return format_html('<a href="{}">Set up alerts</a>', url)
        low = f"below {display_credits(row.low_balance)} credits" if row.low_balance is not None else "off"
        budgets = ", ".join(f"{p}%" for p in row.budget_percents) or "off"
        change = reverse("admin:alerts_alertsettings_change", args=[obj.pk])
        log = reverse("admin:alerts_alertdelivery_changelist") + "?" + urlencode({"q": obj.name})
        return format_html(
            'Low balance {}; key budgets {}; webhook {} &nbsp; <a href="{}">Change</a> &nbsp; '
            '<a href="{}">Deliveries</a>',
            low,
            budgets,
            "on" if row.webhook_url else "off",
            change,
            log,
        )

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
        with transaction.atomic():
            created = account_create(name=obj.name, actor=request.user, via="admin")
            email = form.cleaned_data.get("owner_email")
            if email:
                account_user_create(account=created, email=email, password=form.cleaned_data["owner_password"])
        obj.pk = created.pk
        obj.created_at = created.created_at
        if email:
            messages.info(request, f"The owner {email} can now sign in to the dashboard at /accounts/login/.")

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        if formset.model is Membership:
            try:
                with transaction.atomic():
                    save_membership_formset(request, form.instance, formset)
            except ValidationError as exc:
                messages.error(request, "; ".join(exc.messages))
            return
        super().save_formset(request, form, formset, change)

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
            try:
                credits_grant(account=account, amount=amount, actor=request.user, note=note, via="admin")
            except (InsufficientCredits, InvalidAmount) as exc:
                # The message is in credits; the form keeps what was typed, to correct it.
                form.add_error("amount", str(exc))
            else:
                messages.success(request, f"Granted {display_credits(amount)} credits to {account.name}.")
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
                messages.success(request, f"Granted {display_credits(amount)} credits to {granted} account(s).")
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
    budget = forms.CharField(
        required=False,
        label="Monthly budget (credits)",
        help_text="Credits the key may spend per calendar month (UTC); empty: no cap.",
    )

    class Meta:
        model = ApiKey
        fields = ("account", "name", "scopes", "allowed_models", "rpm", "tpm", "expires_at", "priority")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["allowed_models"].choices = _model_choices()  # type: ignore[attr-defined]
        self.fields["name"].required = False
        if self.instance.pk and self.instance.monthly_budget is not None:
            self.fields["budget"].initial = format_credits(self.instance.monthly_budget)

    def clean_budget(self) -> int | None:
        text = (self.cleaned_data.get("budget") or "").strip()
        if not text:
            return None
        try:
            micro = parse_credits(text, field="budget")
        except AmountError as exc:
            raise ValidationError(str(exc)) from None
        if micro == 0:
            raise ValidationError("budget: must be positive; leave it empty for no budget")
        return micro


class KeyStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("active", "active"), ("revoked", "revoked"), ("expired", "expired")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        from django.db.models import Q
        from django.utils import timezone

        now = timezone.now()
        unexpired = Q(expires_at__isnull=True) | Q(expires_at__gt=now)
        if self.value() == "active":
            return queryset.filter(unexpired, revoked_at__isnull=True)
        if self.value() == "revoked":
            return queryset.filter(revoked_at__isnull=False)
        if self.value() == "expired":
            return queryset.filter(revoked_at__isnull=True, expires_at__lte=now)
        return queryset


_ADMIN_CREATED_KEY = "admin_created_key"


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    form = ApiKeyForm
    list_display = (
        "name",
        "prefix_display",
        "account",
        "scope_list",
        "model_list",
        "spent_this_month",
        "budget_display",
        "last_used_at",
        "expires_at",
        "state",
    )
    list_select_related = ("account",)
    list_filter = (KeyStateFilter,)
    search_fields = ("name", "lookup_id", "account__name")
    readonly_fields = ("prefix_display", "digest", "last_used_at", "revoked_at", "created_at")
    actions = ["revoke_keys"]
    autocomplete_fields = ("account",)

    def get_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> tuple[str, ...]:
        editable = ("name", "scopes", "allowed_models", "rpm", "tpm", "expires_at", "budget")
        if obj is None:
            return ("account", *editable)
        return (
            "account",
            "prefix_display",
            *editable,
            "spent_this_month",
            "digest",
            "last_used_at",
            "revoked_at",
            "created_at",
        )

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> tuple[str, ...]:
        if obj is None:
            return ()
        if obj.revoked_at is not None:
            # A revoked key is history: nothing on it changes.
            return (
                *self.readonly_fields,
                "spent_this_month",
                "account",
                "name",
                "scopes",
                "allowed_models",
                "rpm",
                "tpm",
                "expires_at",
                "budget",
            )
        return (*self.readonly_fields, "spent_this_month", "account")

    def get_queryset(self, request: HttpRequest) -> QuerySet[ApiKey]:
        # Spent this calendar month (UTC) per key, in the list's own query.
        month = month_start(timezone.now())
        spent = KeySpend.objects.filter(api_key=OuterRef("pk"), month=month).values("spent")[:1]
        return super().get_queryset(request).annotate(_spent=Subquery(spent))

    @admin.display(description="Spent this month (credits)")
    def spent_this_month(self, obj: ApiKey) -> str:
        return display_credits(getattr(obj, "_spent", None) or 0)

    @admin.display(description="Monthly budget", ordering="monthly_budget")
    def budget_display(self, obj: ApiKey) -> str:
        return display_credits(obj.monthly_budget) if obj.monthly_budget is not None else "-"

    @admin.display(description="Monthly budget (credits)")
    def budget(self, obj: ApiKey) -> str:
        return self.budget_display(obj)

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
                if data.get("budget") != obj.monthly_budget and "budget" in data:
                    api_key_set_budget(api_key=obj, monthly_budget=data["budget"], actor=request.user, via="admin")
                if "priority" in data and data["priority"] != ApiKey.objects.get(pk=obj.pk).priority:
                    api_key_set_priority(api_key=obj, priority=data["priority"], actor=request.user, via="admin")
                return
            created = api_key_create(
                account=data["account"],
                name=data["name"],
                scopes=data["scopes"],
                allowed_models=data["allowed_models"],
                rpm=data["rpm"],
                tpm=data["tpm"],
                expires_at=data["expires_at"],
                monthly_budget=data.get("budget"),
                priority=data.get("priority") or "normal",
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
        # Post/redirect/get, as on the dashboard: a reload of the page shows no secret and creates no key.
        request.session[_ADMIN_CREATED_KEY] = {"key_id": obj.pk, "secret": secret}
        return HttpResponseRedirect(reverse("admin:accounts_apikey_created"))

    def get_urls(self) -> list[URLPattern]:
        created = path("created/", self.admin_site.admin_view(self.created_view), name="accounts_apikey_created")
        return [created, *super().get_urls()]

    def created_view(self, request: HttpRequest) -> HttpResponse:
        shown = request.session.pop(_ADMIN_CREATED_KEY, None)
        api_key = ApiKey.objects.filter(pk=shown["key_id"]).select_related("account").first() if shown else None
        if api_key is None or shown is None:
            messages.info(request, "A key's secret is shown once, right after it is created, and never again.")
            return HttpResponseRedirect(reverse("admin:accounts_apikey_changelist"))
        context = {
            **self.admin_site.each_context(request),
            "title": "API key created",
            "opts": self.model._meta,
            "api_key": api_key,
            "secret": shown["secret"],
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


@admin.register(Invitation)
class InvitationAdmin(admin.ModelAdmin):
    """Invitations are sent from the dashboard (owners); staff see them and may withdraw them."""

    list_display = ("email", "account", "role", "state", "invited_by", "created_at", "expires_at", "accepted_at")
    list_select_related = ("account",)
    list_filter = ("role",)
    search_fields = ("email", "account__name")
    fields = ("account", "email", "role", "invited_by", "created_at", "expires_at", "accepted_at", "revoked_at")
    readonly_fields = fields
    actions = ["withdraw"]

    @admin.display(description="State")
    def state(self, obj: Invitation) -> str:
        return obj.state

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Invitation | None = None) -> bool:
        return False

    @admin.action(description="Withdraw the selected invitations", permissions=["change"])
    def withdraw(self, request: HttpRequest, queryset: QuerySet[Invitation]) -> None:
        for invitation in queryset.select_related("account"):
            invitation_revoke(invitation=invitation, actor=request.user, via="admin")
        messages.success(request, "Withdrew the selected pending invitations.")


def _readable(value: object) -> str:
    """An audit detail value for people: "none" rather than JSON's null, lists as "a, b"."""
    if value is None:
        return "none"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "none"
    return value if isinstance(value, str) else json.dumps(value)


@admin.register(AuditLog)
class AuditLogAdmin(admin.ModelAdmin):
    list_display = ("created_at", "actor", "action", "target_repr", "detail_summary")
    list_filter = ("action", "target_type", ("created_at", admin.DateFieldListFilter))
    search_fields = ("actor", "target_repr", "target_id")
    date_hierarchy = "created_at"
    fields = ("created_at", "actor", "action", "target_type", "target_id", "target_repr", "detail_pretty")
    readonly_fields = fields

    @admin.display(description="Detail")
    def detail_summary(self, obj: AuditLog) -> str:
        """key: value pairs, whole (not raw JSON cut off)."""
        detail = obj.detail if isinstance(obj.detail, dict) else {"detail": obj.detail}
        return format_html_join(
            "",
            '<div><span style="color: var(--body-quiet-color)">{}:</span> {}</div>',
            ((k, _readable(v)) for k, v in detail.items()),
        )

    @admin.display(description="Detail")
    def detail_pretty(self, obj: AuditLog) -> str:
        return format_html('<pre style="margin:0">{}</pre>', json.dumps(obj.detail, indent=2, sort_keys=True))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: AuditLog | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: AuditLog | None = None) -> bool:
        return False
