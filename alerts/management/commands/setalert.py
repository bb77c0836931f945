from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import CommandError

from accounts.selectors import account_resolve
from alerts.services import UNSET, alert_settings_set
from core.commands import SpeedInferCommand
from core.credits import AmountError, display_credits, parse_credits

_OFF = ("", "none", "off")
_OPTION = {"low_balance": "--low-balance", "webhook": "--webhook", "budget_percent": "--budget-percent"}


def _percents(text: str) -> list[int]:
    if text.strip().lower() in _OFF:
        return []
    try:
        return [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise CommandError(f"--budget-percent: whole numbers from 1 to 1000, comma-separated, not {text!r}") from None


class Command(SpeedInferCommand):
    help = (
        "Configure an account's spend alerts; only the options given change. --low-balance CREDITS alerts when "
        "available falls below it; --webhook URL also POSTs each alert there, signed (the new signing secret is "
        "printed on the last line); --budget-percent P[,P...] alerts when a key's monthly spend crosses P% of its "
        "budget (P from 1 to 1000). 'none' turns a setting off."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("account", help="account id or name")
        parser.add_argument("--low-balance", metavar="CREDITS", help="threshold in credits, or none")
        parser.add_argument("--webhook", metavar="URL", help="http(s) URL without credentials, or none")
        parser.add_argument("--budget-percent", metavar="P[,P...]", help="e.g. 80,100, or none")

    def run(self, *args: Any, **options: Any) -> None:
        account = account_resolve(ref=options["account"])
        if account is None:
            raise CommandError(f"account: no account {options['account']!r}")
        low_balance: int | None = UNSET
        if options["low_balance"] is not None:
            text = options["low_balance"]
            try:
                low_balance = None if text.strip().lower() in _OFF else parse_credits(text, field="--low-balance")
            except AmountError as exc:
                raise CommandError(str(exc)) from None
        webhook = UNSET
        if options["webhook"] is not None:
            webhook = "" if options["webhook"].strip().lower() in _OFF else options["webhook"]
        percents = UNSET if options["budget_percent"] is None else _percents(options["budget_percent"])
        try:
            change = alert_settings_set(
                account=account,
                low_balance=low_balance,
                webhook_url=webhook,
                budget_percents=percents,
                rotate_secret=True,  # the command prints the secret, so each --webhook makes a new one
                actor="manage.py setalert",
                via="command",
            )
        except ValidationError as exc:
            field, errors = next(iter(exc.error_dict.items()))
            raise CommandError(f"{_OPTION.get(field, field)}: {errors[0].messages[0]}") from None
        row = change.settings
        low = f"below {display_credits(row.low_balance)} credits" if row.low_balance is not None else "off"
        budgets = ", ".join(f"{p}%" for p in row.budget_percents) or "off"
        self.stdout.write(
            f"Alerts for {account.name!r}: low balance {low}; key budgets {budgets}; webhook {row.webhook_url or 'off'}"
        )
        if change.secret:
            self.stdout.write("Webhook signing secret (shown once):")
            self.stdout.write(change.secret)
