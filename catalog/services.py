"""Writes to the model registry."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from catalog.models import PublicModel
from core.audit import audit_record
from core.credits import format_credits


def model_register(
    *,
    model_id: str,
    input_price: int,
    output_price: int,
    max_output_tokens: int | None = None,
    kind: str | None = None,
    cached_input_price: int | None = None,
    media_tokens: int | None = None,
    actor: object = "",
    via: str = "",
) -> tuple[PublicModel, bool]:
    """Create or update a public model. Prices in micro-credits per 1,000,000 tokens.

    With an `actor`, the change (and the previous prices) is audited in its transaction."""
    model_id = model_id.strip()
    if not model_id:
        raise ValidationError({"model_id": "must not be empty"})
    if max_output_tokens is not None and max_output_tokens < 1:
        raise ValidationError({"max_output_tokens": "must be a positive integer"})
    if media_tokens is not None and media_tokens < 0:
        raise ValidationError({"media_tokens": "must be 0 or a positive integer"})
    if cached_input_price is not None and cached_input_price < 0:
        raise ValidationError({"cached_input_price": "must not be negative"})
    with transaction.atomic():
        model = PublicModel.objects.select_for_update().filter(model_id=model_id).first()
        created = model is None
        if model is None:
            model = PublicModel(model_id=model_id, max_output_tokens=settings.SPEEDINFER_DEFAULT_MAX_OUTPUT_TOKENS)
        previous = (model.input_price, model.output_price)
        model.input_price = input_price
        model.output_price = output_price
        if max_output_tokens is not None:
            model.max_output_tokens = max_output_tokens
        if kind is not None:
            model.kind = kind
        if cached_input_price is not None:
            model.cached_input_price = cached_input_price
        if media_tokens is not None:
            model.media_tokens = media_tokens
        model.full_clean()
        model.save()
        if actor:
            detail: dict[str, object] = {
                "input_price": format_credits(input_price),
                "output_price": format_credits(output_price),
                "max_output_tokens": model.max_output_tokens,
                "kind": model.kind,
                "cached_input_price": format_credits(model.cached_input_price_or_input),
                "media_tokens": model.media_tokens,
            }
            if not created:
                detail["previous_input_price"] = format_credits(previous[0])
                detail["previous_output_price"] = format_credits(previous[1])
            if via:
                detail["via"] = via
            action = "model.create" if created else "model.update"
            audit_record(actor=actor, action=action, target=model, detail=detail)
    return model, created
