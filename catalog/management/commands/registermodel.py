from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from catalog.models import ModelKind
from catalog.services import model_register
from core.commands import SpeedInferCommand
from core.credits import AmountError, format_credits, parse_credits


class Command(SpeedInferCommand):
    help = "Create or update a public model. Prices are credits per 1,000,000 tokens (up to 6 decimals)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("model_id", help="the public model id clients send, e.g. acme/model-1")
        parser.add_argument("--input-price", required=True, help="credits per 1M prompt tokens")
        parser.add_argument("--output-price", required=True, help="credits per 1M completion tokens")
        parser.add_argument("--max-output-tokens", type=int, help="cap on completion tokens per request")
        parser.add_argument(
            "--kind",
            help="which endpoints the model serves: chat (chat, completions, responses), embeddings, rerank, "
            "or any (the default)",
        )
        parser.add_argument(
            "--cached-input-price", help="credits per 1M cached prompt tokens (default: the input price)"
        )
        parser.add_argument(
            "--media-tokens",
            type=int,
            help="the most tokens one image, audio, video or file part may cost (0: no media parts)",
        )

    def run(self, *args: Any, **options: Any) -> None:
        try:
            input_price = parse_credits(options["input_price"], field="input-price")
            output_price = parse_credits(options["output_price"], field="output-price")
            cached = options["cached_input_price"]
            cached_price = None if cached is None else parse_credits(cached, field="cached-input-price")
        except AmountError as exc:
            raise CommandError(str(exc)) from None
        if options.get("kind") is not None and options["kind"] not in ModelKind.values:
            raise CommandError(f"kind: must be one of {', '.join(ModelKind.values)}")
        model, created = model_register(
            model_id=options["model_id"],
            input_price=input_price,
            output_price=output_price,
            max_output_tokens=options["max_output_tokens"],
            kind=options.get("kind"),
            cached_input_price=cached_price,
            media_tokens=options["media_tokens"],
            actor="manage.py registermodel",
            via="command",
        )
        self.stdout.write(
            f"{'Created' if created else 'Updated'} model {model.model_id}: input {format_credits(model.input_price)}, "
            f"output {format_credits(model.output_price)} credits per 1M tokens, max output {model.max_output_tokens}"
        )
