"""Staff REST API for public models and their prices (credits per 1,000,000 tokens, decimal strings)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from catalog.models import ModelKind, PublicModel
from catalog.services import model_register
from console.api.accounts import drf_error
from core.credits import AmountError, format_credits, parse_credits


def model_document(model: PublicModel) -> dict[str, Any]:
    return {
        "id": model.model_id,
        "input_price": format_credits(model.input_price),
        "output_price": format_credits(model.output_price),
        "max_output_tokens": model.max_output_tokens,
        "kind": model.kind,
        "enabled": model.enabled,
        "updated_at": model.updated_at.isoformat(),
    }


class _Price(serializers.Field):
    """Credits per 1,000,000 tokens as a decimal string (a JSON number is accepted too)."""

    def to_internal_value(self, data: Any) -> int:
        if not isinstance(data, str | int | float) or isinstance(data, bool):
            raise serializers.ValidationError("a decimal string of credits is required")
        try:
            return parse_credits(str(data), field=self.field_name or "price")
        except AmountError as exc:
            raise serializers.ValidationError(str(exc)) from None

    def to_representation(self, value: int) -> str:
        return format_credits(value)


class ModelIn(serializers.Serializer):
    id = serializers.CharField(max_length=200)
    input_price = _Price()
    output_price = _Price()
    max_output_tokens = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None)
    kind = serializers.ChoiceField(choices=ModelKind.choices, required=False, allow_null=True, default=None)


class ModelUpdateIn(serializers.Serializer):
    input_price = _Price(required=False)
    output_price = _Price(required=False)
    max_output_tokens = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None)
    kind = serializers.ChoiceField(choices=ModelKind.choices, required=False, allow_null=True, default=None)


def _register(
    request: Request,
    *,
    model_id: str,
    input_price: int,
    output_price: int,
    max_output_tokens: int | None,
    kind: str | None = None,
) -> tuple[PublicModel, bool]:
    try:
        model, created = model_register(
            model_id=model_id,
            input_price=input_price,
            output_price=output_price,
            max_output_tokens=max_output_tokens,
            kind=kind,
            actor=request.user,
            via="api",
        )
    except ValidationError as exc:
        raise drf_error(exc) from None
    return model, created


class ModelListApi(APIView):
    """GET: every public model with its prices. POST {id, input_price, output_price, max_output_tokens?}:
    create or update (201 created, 200 updated)."""

    def get(self, request: Request) -> Response:
        return Response({"data": [model_document(m) for m in PublicModel.objects.order_by("model_id")]})

    def post(self, request: Request) -> Response:
        data = ModelIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        model, created = _register(
            request,
            model_id=v["id"],
            input_price=v["input_price"],
            output_price=v["output_price"],
            max_output_tokens=v["max_output_tokens"],
            kind=v["kind"],
        )
        return Response(model_document(model), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class ModelDetailApi(APIView):
    """GET one model; PATCH (or PUT) its prices and output cap."""

    def _get(self, model_id: str) -> PublicModel:
        model = PublicModel.objects.filter(model_id=model_id).first()
        if model is None:
            raise NotFound(f"no model {model_id!r}")
        return model

    def get(self, request: Request, model_id: str) -> Response:
        return Response(model_document(self._get(model_id)))

    def patch(self, request: Request, model_id: str) -> Response:
        model = self._get(model_id)
        data = ModelUpdateIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        model, _ = _register(
            request,
            model_id=model.model_id,
            input_price=v.get("input_price", model.input_price),
            output_price=v.get("output_price", model.output_price),
            max_output_tokens=v["max_output_tokens"],
            kind=v["kind"],
        )
        return Response(model_document(model))

    put = patch
