"""Staff admin for models and prices, the ledger, reservations and usage.

Ledger, reservations and usage are append-only records: read-only here. Prices
are entered as decimal credits per 1,000,000 tokens and saved through
billing.services.model_register; every price change is audited.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.urls import URLPattern, path, reverse

from billing.models import LedgerEntry, Reservation, UsageRecord
from catalog.models import PublicModel
from catalog.services import model_register
from core.credits import MICRO, display_credits, format_credits
from workers.models import Worker


def _credits_field(label: str) -> forms.DecimalField:
    return forms.DecimalField(
        label=label, min_value=Decimal(0), max_digits=18, decimal_places=6, help_text="credits per 1,000,000 tokens"
    )


class PublicModelForm(forms.ModelForm):
    input_price_credits = _credits_field("Input price")
    output_price_credits = _credits_field("Output price")

    class Meta:
        model = PublicModel
        fields = ("model_id", "max_output_tokens", "kind", "media_tokens")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["kind"].required = False  # unset: a new model serves every endpoint, an old one keeps its kind
        self.fields["media_tokens"].required = False  # blank: unchanged (0, no media parts, for a new model)
        if self.instance.pk:
            self.fields["input_price_credits"].initial = format_credits(self.instance.input_price)
            self.fields["output_price_credits"].initial = format_credits(self.instance.output_price)


@admin.register(PublicModel)
class PublicModelAdmin(admin.ModelAdmin):
    form = PublicModelForm
    list_display = (
        "model_id",
        "input_price_display",
        "output_price_display",
        "max_output_tokens",
        "kind",
        "enabled",
        "updated_at",
    )
    search_fields = ("model_id",)
    list_filter = ("enabled",)

    def get_fields(self, request: HttpRequest, obj: PublicModel | None = None) -> tuple[str, ...]:
        fields = (
            "model_id",
            "input_price_credits",
            "output_price_credits",
            "max_output_tokens",
            "kind",
            "media_tokens",
        )
        return fields + (("cached_input_price_display", "enabled", "created_at", "updated_at") if obj else ())

    def get_readonly_fields(self, request: HttpRequest, obj: PublicModel | None = None) -> tuple[str, ...]:
        # The cached input price is set with `registermodel --cached-input-price` (blank there: the input price).
        return ("model_id", "cached_input_price_display", "enabled", "created_at", "updated_at") if obj else ()

    @admin.display(description="Cached input price (credits / 1M tokens)")
    def cached_input_price_display(self, obj: PublicModel) -> str:
        return display_credits(obj.cached_input_price_or_input)

    @admin.display(description="Input price (credits / 1M tokens)", ordering="input_price")
    def input_price_display(self, obj: PublicModel) -> str:
        return display_credits(obj.input_price)

    @admin.display(description="Output price (credits / 1M tokens)", ordering="output_price")
    def output_price_display(self, obj: PublicModel) -> str:
        return display_credits(obj.output_price)

    def has_delete_permission(self, request: HttpRequest, obj: PublicModel | None = None) -> bool:
        return False  # usage and reservations name models; disable workers instead

    def save_model(self, request: HttpRequest, obj: PublicModel, form: Any, change: bool) -> None:
        data = form.cleaned_data
        model, _ = model_register(
            model_id=data["model_id"] if not change else obj.model_id,
            input_price=int(data["input_price_credits"] * MICRO),
            output_price=int(data["output_price_credits"] * MICRO),
            max_output_tokens=data["max_output_tokens"],
            kind=data.get("kind") or None,
            media_tokens=data["media_tokens"],
            actor=request.user,
            via="admin",
        )
        obj.pk = model.pk

    def _changeform_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return super()._changeform_view(request, *args, **kwargs)  # type: ignore[misc]
        except ValidationError as exc:
            from django.contrib import messages
            from django.http import HttpResponseRedirect

            messages.error(request, "; ".join(exc.messages))
            return HttpResponseRedirect(request.get_full_path())


class ReadOnlyAdmin(admin.ModelAdmin):
    """Append-only records: staff look, nobody edits or deletes."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "created_at",
        "account",
        "kind",
        "amount_credits",
        "available_after_credits",
        "reserved_after_credits",
        "actor",
        "note",
    )
    list_select_related = ("account",)
    list_filter = ("kind", ("created_at", admin.DateFieldListFilter), ("account", admin.RelatedOnlyFieldListFilter))
    search_fields = ("account__name", "reference", "actor", "note")
    date_hierarchy = "created_at"
    show_full_result_count = False

    @admin.display(description="Amount (credits)", ordering="amount")
    def amount_credits(self, obj: LedgerEntry) -> str:
        return display_credits(obj.amount)

    @admin.display(description="Available after")
    def available_after_credits(self, obj: LedgerEntry) -> str:
        return display_credits(obj.available_after)

    @admin.display(description="Reserved after")
    def reserved_after_credits(self, obj: LedgerEntry) -> str:
        return display_credits(obj.reserved_after)


@admin.register(Reservation)
class ReservationAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "account", "model_id", "amount_credits", "status", "closed_at", "request_id", "id")
    list_select_related = ("account",)
    ordering = ("-created_at",)
    list_filter = ("status", ("created_at", admin.DateFieldListFilter))
    search_fields = ("request_id", "account__name")
    show_full_result_count = False

    @admin.display(description="Amount (credits)", ordering="amount")
    def amount_credits(self, obj: Reservation) -> str:
        return display_credits(obj.amount)


class ModelFilter(admin.SimpleListFilter):
    """Choices from the registered models, not a DISTINCT over millions of usage rows."""

    title = "model"
    parameter_name = "model_id"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(m, m) for m in PublicModel.objects.values_list("model_id", flat=True)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(model_id=self.value()) if self.value() else queryset


class WorkerFilter(admin.SimpleListFilter):
    title = "worker"
    parameter_name = "worker_id"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(w, w) for w in Worker.objects.values_list("worker_id", flat=True)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(worker_id=self.value()) if self.value() else queryset


class UnchargedOverrunFilter(admin.SimpleListFilter):
    """Requests whose worker reported more usage than the account could pay: with the worker filter,
    which workers overrun and by how much (docs/interface.md, Money invariants)."""

    title = "uncharged overrun"
    parameter_name = "uncharged"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "With an uncharged overrun"), ("no", "Without")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "yes":
            return queryset.filter(uncharged__gt=0)
        if self.value() == "no":
            return queryset.filter(uncharged=0)
        return queryset


class _Echo:
    def write(self, value: str) -> str:
        return value


USAGE_CSV_HEADER = [
    "created_at",
    "request_id",
    "account",
    "key",
    "endpoint",
    "model",
    "worker",
    "status",
    "error_code",
    "prompt_tokens",
    "completion_tokens",
    "cost_credits",
    "reserved_credits",
    "latency_ms",
    "ttft_ms",
    "streamed",
    "cached_tokens",
    "reasoning_tokens",
]


def usage_csv_response(queryset: QuerySet[UsageRecord], filename: str) -> StreamingHttpResponse:
    def rows() -> Iterator[list[Any]]:
        yield USAGE_CSV_HEADER
        for r in queryset.select_related("account", "api_key").iterator(chunk_size=2000):
            yield [
                r.created_at.isoformat(),
                r.request_id,
                r.account.name,
                r.api_key.prefix if r.api_key else "",
                r.endpoint,
                r.model_id,
                r.worker_id,
                r.status,
                r.error_code,
                r.prompt_tokens,
                r.completion_tokens,
                format_credits(r.cost),
                format_credits(r.reserved),
                r.latency_ms,
                "" if r.ttft_ms is None else r.ttft_ms,
                "yes" if r.streamed else "no",
                r.cached_tokens,
                r.reasoning_tokens,
            ]

    writer = csv.writer(_Echo())
    response = StreamingHttpResponse((writer.writerow(row) for row in rows()), content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@admin.register(UsageRecord)
class UsageRecordAdmin(ReadOnlyAdmin):
    # Cost and latency first after who/what: they fit at 1280 px; the long request id goes last.
    list_display = (
        "created_at",
        "account",
        "model_id",
        "status",
        "cost_credits",
        "uncharged_credits",
        "latency_ms",
        "ttft_ms",
        "prompt_tokens",
        "completion_tokens",
        "worker_id",
        "request_id",
    )
    list_select_related = ("account",)
    list_filter = (
        ("account", admin.RelatedOnlyFieldListFilter),
        ModelFilter,
        WorkerFilter,
        UnchargedOverrunFilter,
        "status",
        ("created_at", admin.DateFieldListFilter),
    )
    search_fields = ("=request_id",)
    date_hierarchy = "created_at"
    show_full_result_count = False  # a COUNT(*) over millions of rows per page view is not worth it
    actions = ["export_csv"]
    change_list_template = "admin/billing/usagerecord/change_list.html"

    @admin.display(description="Cost (credits)", ordering="cost")
    def cost_credits(self, obj: UsageRecord) -> str:
        return display_credits(obj.cost)

    @admin.display(description="Uncharged overrun (credits)", ordering="uncharged")
    def uncharged_credits(self, obj: UsageRecord) -> str:
        return display_credits(obj.uncharged) if obj.uncharged else "-"

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_active and request.user.is_staff)

    @admin.action(description="Export the selected usage records as CSV", permissions=["view"])
    def export_csv(self, request: HttpRequest, queryset: QuerySet[UsageRecord]) -> StreamingHttpResponse:
        return usage_csv_response(queryset, "usage-selected.csv")

    def get_urls(self) -> list[URLPattern]:
        custom = [path("export.csv", self.admin_site.admin_view(self.export_view), name="billing_usagerecord_export")]
        return custom + super().get_urls()

    def export_view(self, request: HttpRequest) -> StreamingHttpResponse:
        """Everything the change list's current filters match, streamed."""
        if not self.has_view_permission(request):
            from django.core.exceptions import PermissionDenied

            raise PermissionDenied
        changelist = self.get_changelist_instance(request)
        return usage_csv_response(changelist.get_queryset(request), "usage.csv")

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        query = request.GET.urlencode()
        url = reverse("admin:billing_usagerecord_export") + (f"?{query}" if query else "")
        return super().changelist_view(request, {**(extra_context or {}), "export_url": url})
