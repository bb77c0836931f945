"""The model registry: the public model ids customers ask for, with their prices and caps."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class ModelKind(models.TextChoices):
    """Which endpoints a model serves: `any` (the default) every one its workers can."""

    ANY = "any"
    CHAT = "chat"  # chat completions, completions, responses
    EMBEDDINGS = "embeddings"
    RERANK = "rerank"


# The gateway's endpoint names (runtimes.request) each kind serves.
KIND_ENDPOINTS = {
    ModelKind.CHAT: frozenset({"chat", "completions", "responses"}),
    ModelKind.EMBEDDINGS: frozenset({"embeddings"}),
    ModelKind.RERANK: frozenset({"rerank"}),
}


class PublicModel(models.Model):
    """A public model id customers ask for, with its prices.

    Prices are micro-credits per 1,000,000 tokens, which is the same integer as
    "credits per token" times 10^12: a price given in credits with up to six
    decimals is stored exactly.
    """

    model_id = models.CharField(max_length=200, unique=True)
    input_price = models.BigIntegerField(help_text="micro-credits per 1,000,000 prompt tokens")
    output_price = models.BigIntegerField(help_text="micro-credits per 1,000,000 completion tokens")
    max_output_tokens = models.PositiveIntegerField(default=4096)
    kind = models.CharField(max_length=16, choices=ModelKind.choices, default=ModelKind.ANY)
    # Null: cached prompt tokens cost the input price (registermodel --cached-input-price).
    cached_input_price = models.BigIntegerField(
        null=True, blank=True, help_text="micro-credits per 1,000,000 cached prompt tokens (empty: the input price)"
    )
    # 0: the model takes no media content parts (registermodel --media-tokens N).
    media_tokens = models.PositiveIntegerField(
        default=0, db_default=0, help_text="the most tokens one image, audio, video or file part may cost"
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model_id"]
        verbose_name = "model"
        # Moved from billing; the table keeps its name (catalog/0001, billing/0003).
        db_table = "billing_publicmodel"
        constraints = [
            models.CheckConstraint(condition=models.Q(input_price__gte=0), name="model_input_price_non_negative"),
            models.CheckConstraint(condition=models.Q(output_price__gte=0), name="model_output_price_non_negative"),
        ]

    def __str__(self) -> str:
        return self.model_id

    def serves(self, endpoint: str) -> bool:
        """Whether this model's kind serves the gateway endpoint `endpoint` (chat, embeddings, ...)."""
        allowed = KIND_ENDPOINTS.get(ModelKind(self.kind))
        return allowed is None or endpoint in allowed

    @property
    def cached_input_price_or_input(self) -> int:
        return self.input_price if self.cached_input_price is None else self.cached_input_price
