"""Staff admin for spend alerts: each account's settings (changed through alerts.services, audited) and the
read-only event and delivery log."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest

from alerts.models import AlertDelivery, AlertEvent, AlertSettings
from alerts.services import alert_settings_set, budget_percents_validate, webhook_url_validate
from console.admin.billing import ReadOnlyAdmin
from core.credits import AmountError, display_credits, format_credits, parse_credits


class AlertSettingsForm(forms.ModelForm):
    low_balance_credits = forms.CharField(
        required=False, label="Low-balance threshold (credits)", help_text="Empty: no low-balance alert."
    )
    percents = forms.CharField(
        required=False, label="Key budget percentages", help_text="Comma-separated, 1 to 1000, e.g. 80, 100."
    )
    webhook_url = forms.CharField(
        required=False, max_length=500, label="Webhook URL", help_text="http(s), no credentials. Empty: off."
    )
    rotate_secret = forms.BooleanField(required=False, label="Make a new webhook signing secret")

    class Meta:
        model = AlertSettings
        fields = ("account", "webhook_url")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        row = self.instance
        if row.pk and not self.is_bound:
            if row.low_balance:
                self.initial["low_balance_credits"] = format_credits(row.low_balance)
            self.initial["percents"] = ", ".join(str(p) for p in row.budget_percents)

    def clean_low_balance_credits(self) -> int | None:
        text = (self.cleaned_data.get("low_balance_credits") or "").strip()
        if not text:
            return None
        try:
            return parse_credits(text, field="low_balance")
        except AmountError as exc:
            raise ValidationError(str(exc)) from None

    def clean_percents(self) -> list[int]:
        parts = [p.strip().rstrip("%") for p in (self.cleaned_data.get("percents") or "").split(",") if p.strip()]
        try:
            percents = [int(p) for p in parts]
        except ValueError:
            raise ValidationError("Whole numbers from 1 to 1000, separated by commas.") from None
        try:
            return budget_percents_validate(percents)
        except ValidationError as exc:
            raise ValidationError(exc.messages[0]) from None

    def clean_webhook_url(self) -> str:
        url = (self.cleaned_data.get("webhook_url") or "").strip()
        try:
            return webhook_url_validate(url) if url else ""
        except ValidationError as exc:
            raise ValidationError(exc.messages[0]) from None

    def _post_clean(self) -> None:
        # The model is saved by the service (validation included), not by ModelForm.
        pass


@admin.register(AlertSettings)
class AlertSettingsAdmin(admin.ModelAdmin):
    form = AlertSettingsForm
    list_display = ("account", "threshold", "budget_percents", "webhook_url", "updated_at")
    list_select_related = ("account",)
    search_fields = ("account__name",)
    raw_id_fields = ("account",)
    readonly_fields = ("balance_below", "updated_at")

    def get_fields(self, request: HttpRequest, obj: AlertSettings | None = None) -> Any:
        fields = ["low_balance_credits", "webhook_url", "percents", "rotate_secret", "balance_below", "updated_at"]
        return fields if obj else ["account", *fields]

    @admin.display(description="Low balance (credits)")
    def threshold(self, obj: AlertSettings) -> str:
        return display_credits(obj.low_balance) if obj.low_balance is not None else "-"

    def save_model(self, request: HttpRequest, obj: AlertSettings, form: Any, change: bool) -> None:
        data = form.cleaned_data
        try:
            result = alert_settings_set(
                account=data.get("account") or obj.account,
                low_balance=data["low_balance_credits"],
                webhook_url=data.get("webhook_url") or "",
                budget_percents=data["percents"],
                rotate_secret=data["rotate_secret"],
                actor=request.user,
                via="admin",
            )
        except ValidationError as exc:
            messages.error(request, "; ".join(exc.messages))
            return
        obj.pk = result.settings.pk
        if result.secret:
            messages.warning(request, f"The webhook signing secret (shown once): {result.secret}")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class AlertDeliveryInline(admin.TabularInline):
    model = AlertDelivery
    extra = 0
    can_delete = False
    fields = ("channel", "target", "status", "attempts", "next_attempt_at", "last_status_code", "last_error")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(AlertEvent)
class AlertEventAdmin(ReadOnlyAdmin):
    list_display = ("id", "type", "account", "created")
    list_filter = ("type",)
    list_select_related = ("account",)
    search_fields = ("id", "account__name")
    readonly_fields = ("id", "type", "account", "data", "created")
    inlines = [AlertDeliveryInline]


@admin.register(AlertDelivery)
class AlertDeliveryAdmin(ReadOnlyAdmin):
    list_display = (
        "created_at",
        "event",
        "account",
        "channel",
        "target",
        "status",
        "attempts",
        "next_attempt_at",
        "last_status_code",
        "last_error",
    )
    list_filter = ("status", "channel")
    list_select_related = ("event__account",)
    search_fields = ("event__id", "target", "event__account__name")

    @admin.display(description="Account")
    def account(self, obj: AlertDelivery) -> str:
        return obj.event.account.name
