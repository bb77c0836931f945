from __future__ import annotations

from argparse import ArgumentParser
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import CommandError
from django.utils import timezone

from accounts.selectors import account_resolve
from accounts.services import KEY_PRIORITIES, api_key_create
from core.commands import SpeedInferCommand
from core.credits import AmountError, format_credits, parse_credits


def _csv(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [item.strip() for item in value.split(",") if item.strip()]


class Command(SpeedInferCommand):
    help = (
        "Create an API key for an account and print its secret on the last line. "
        "The secret is shown once and never again."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("account", help="account id or name")
        parser.add_argument("--name", default="", help="a label for the key")
        parser.add_argument("--scopes", help="comma-separated: chat,completions,embeddings,models,usage,admin")
        parser.add_argument("--models", help="comma-separated allow-list of public model ids (default: all)")
        parser.add_argument("--rpm", type=int, help="requests per minute")
        parser.add_argument("--tpm", type=int, help="tokens per minute")
        parser.add_argument("--expires", help="ISO 8601 date or datetime (UTC unless it has an offset)")
        parser.add_argument("--budget", help="credits the key may spend per calendar month (UTC)")
        parser.add_argument(
            "--priority", default="normal", help="high|normal|low: its turn while a model is at capacity"
        )

    def run(self, *args: Any, **options: Any) -> None:
        account = account_resolve(ref=options["account"])
        if account is None:
            raise CommandError(f"account: no account {options['account']!r}")
        expires_at = None
        if options["expires"]:
            try:
                expires_at = datetime.fromisoformat(options["expires"])
            except ValueError:
                raise CommandError(f"expires: not an ISO 8601 date: {options['expires']!r}") from None
            if timezone.is_naive(expires_at):
                expires_at = timezone.make_aware(expires_at, UTC)
        budget = None
        if options["budget"] is not None:
            try:
                budget = parse_credits(options["budget"], field="budget")
            except AmountError as exc:
                raise CommandError(str(exc)) from None
        if options["priority"] not in KEY_PRIORITIES:
            raise CommandError(f"--priority: must be one of {', '.join(KEY_PRIORITIES)}, got {options['priority']!r}")
        created = api_key_create(
            account=account,
            name=options["name"],
            scopes=_csv(options["scopes"]),
            allowed_models=_csv(options["models"]) or [],
            rpm=options["rpm"],
            tpm=options["tpm"],
            expires_at=expires_at,
            monthly_budget=budget,
            priority=options["priority"],
            actor="manage.py createapikey",
            via="command",
        )
        key = created.api_key
        self.stdout.write(
            f"Created key {key.name!r} ({key.prefix}) for {account.name!r}, scopes {','.join(key.scopes)}"
            + (f", budget {format_credits(budget)} credits a month" if budget is not None else "")
        )
        self.stdout.write(created.secret)
