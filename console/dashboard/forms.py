"""Forms of the customer dashboard. They only parse input; views call services."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from typing import Any

from django import forms
from django.utils import timezone

from accounts.models import DEFAULT_SCOPES
from catalog.models import PublicModel
from core.credits import AmountError, parse_credits

# Customers never get the `admin` scope: it opens the staff API.
CUSTOMER_SCOPES = [(scope, scope) for scope in DEFAULT_SCOPES]
MAX_RANGE_DAYS = 366
DEFAULT_RANGE_DAYS = 30
# Date arithmetic near date.min/date.max overflows (start = end - 29 days, end + 1 day
# in the queries), so the range is bounded to dates a usage record can have.
EARLIEST_DAY = date(2000, 1, 1)
LATEST_DAY = date(2999, 12, 31)


def _within_bounds(day: date | None) -> date | None:
    if day is not None and not EARLIEST_DAY <= day <= LATEST_DAY:
        raise forms.ValidationError(f"Choose a date between {EARLIEST_DAY} and {LATEST_DAY}.")
    return day


class UsageRangeForm(forms.Form):
    start = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    end = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))

    def clean_start(self) -> date | None:
        return _within_bounds(self.cleaned_data.get("start"))

    def clean_end(self) -> date | None:
        return _within_bounds(self.cleaned_data.get("end"))

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.errors:
            return cleaned
        today = timezone.localdate()
        end = cleaned.get("end") or today
        start = cleaned.get("start") or end - timedelta(days=DEFAULT_RANGE_DAYS - 1)
        if start > end:
            raise forms.ValidationError("The start date must not be after the end date.")
        if (end - start).days >= MAX_RANGE_DAYS:
            raise forms.ValidationError(f"Choose at most {MAX_RANGE_DAYS} days.")
        cleaned["start"], cleaned["end"] = start, end
        return cleaned

    def range(self) -> tuple[date, date]:
        """The chosen range, or the default one when the input is invalid."""
        if self.is_valid():
            return self.cleaned_data["start"], self.cleaned_data["end"]
        today = timezone.localdate()
        return today - timedelta(days=DEFAULT_RANGE_DAYS - 1), today


class ApiKeyCreateForm(forms.Form):
    name = forms.CharField(max_length=100, required=False, help_text="Optional; a name helps you find it later.")
    scopes = forms.MultipleChoiceField(
        choices=CUSTOMER_SCOPES,
        initial=list(DEFAULT_SCOPES),
        widget=forms.CheckboxSelectMultiple,
        error_messages={"required": "Choose at least one scope."},
    )
    allowed_models = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Models",
        help_text="Leave all unticked to allow every model.",
    )
    expires = forms.DateField(
        required=False,
        widget=forms.DateInput(attrs={"type": "date"}),
        help_text="Optional; the key stops at 00:00 UTC.",
    )
    budget = forms.CharField(
        required=False,
        label="Monthly budget",
        widget=forms.TextInput(attrs={"inputmode": "decimal", "placeholder": "e.g. 5"}),
        help_text="Optional; credits this key may spend per calendar month (UTC). Empty: no cap.",
    )

    priority = forms.ChoiceField(
        choices=[("normal", "normal"), ("high", "high"), ("low", "low")],
        initial="normal",
        required=False,
        help_text="While a model's GPUs are all busy: high is served first, low is refused at once.",
    )

    def clean_budget(self) -> int | None:
        return clean_budget_text(self.cleaned_data.get("budget") or "")

    def clean_priority(self) -> str:
        return self.cleaned_data.get("priority") or "normal"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        model_ids = PublicModel.objects.filter(enabled=True).values_list("model_id", flat=True)
        self.fields["allowed_models"].choices = [(m, m) for m in model_ids]  # type: ignore[attr-defined]

    def clean_expires(self) -> datetime | None:
        day: date | None = self.cleaned_data.get("expires")
        if day is None:
            return None
        if day <= timezone.localdate():
            raise forms.ValidationError("Choose a date after today.")
        return datetime.combine(day, time.min, tzinfo=timezone.get_current_timezone())


def clean_budget_text(text: str) -> int | None:
    """A budget typed in credits to micro-credits; empty means no budget."""
    text = text.strip()
    if not text:
        return None
    try:
        micro = parse_credits(text, field="budget")
    except AmountError as exc:
        reason = str(exc).removeprefix("budget: ")
        raise forms.ValidationError(reason[:1].upper() + reason[1:]) from None
    if micro == 0:
        raise forms.ValidationError("Leave it empty for no budget, or give a positive amount of credits.")
    return micro


class KeyBudgetForm(forms.Form):
    budget = forms.CharField(required=False, max_length=30)

    def clean_budget(self) -> int | None:
        return clean_budget_text(self.cleaned_data.get("budget") or "")


class AlertSettingsForm(forms.Form):
    low_balance = forms.CharField(
        required=False,
        max_length=30,
        label="Low-balance alert (credits)",
        help_text="Alert when the available balance falls below this. Empty: off.",
    )
    webhook_url = forms.CharField(
        required=False,
        max_length=500,
        label="Webhook URL",
        help_text="Also POST each alert here, signed (SpeedInfer-Signature). http(s), no credentials. Empty: off.",
    )
    budget_percents = forms.CharField(
        required=False,
        max_length=100,
        label="Key budget alerts (%)",
        help_text="Alert when a key's monthly spend crosses these percentages of its budget, e.g. 80, 100.",
    )
    rotate_secret = forms.BooleanField(required=False, label="Make a new webhook signing secret")

    def clean_low_balance(self) -> int | None:
        text = (self.cleaned_data.get("low_balance") or "").strip()
        if not text:
            return None
        try:
            micro = parse_credits(text, field="low_balance")
        except AmountError as exc:
            raise forms.ValidationError(str(exc).removeprefix("low_balance: ").capitalize()) from None
        if micro == 0:
            raise forms.ValidationError("Leave it empty for no alert, or give a positive amount of credits.")
        return micro

    def clean_budget_percents(self) -> list[int]:
        text = self.cleaned_data.get("budget_percents") or ""
        parts = [p.strip().rstrip("%") for p in text.replace(";", ",").split(",") if p.strip()]
        try:
            return [int(p) for p in parts]
        except ValueError:
            raise forms.ValidationError("Whole numbers from 1 to 1000, separated by commas.") from None
