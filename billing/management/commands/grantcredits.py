from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from accounts.selectors import account_resolve
from billing.services import InsufficientCredits, InvalidAmount, credits_grant
from core.commands import SpeedInferCommand
from core.credits import AmountError, format_credits, parse_credits


class Command(SpeedInferCommand):
    help = "Grant credits to an account (a negative amount removes them). AMOUNT is in credits, up to 6 decimals."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("account", help="account id or name")
        parser.add_argument("amount", help="credits, e.g. 25 or 0.5 or -3")
        parser.add_argument("--note", default="", help="why, kept in the ledger")

    def run(self, *args: Any, **options: Any) -> None:
        account = account_resolve(ref=options["account"])
        if account is None:
            raise CommandError(f"account: no account {options['account']!r}")
        try:
            amount = parse_credits(options["amount"], allow_negative=True)
            entry = credits_grant(
                account=account, amount=amount, actor="manage.py grantcredits", note=options["note"], via="command"
            )
        except AmountError as exc:
            raise CommandError(str(exc)) from None  # already names the field
        except (InvalidAmount, InsufficientCredits) as exc:
            raise CommandError(f"amount: {exc}") from None
        available = format_credits(entry.available_after)
        self.stdout.write(f"Granted {format_credits(amount)} credits to {account.name!r}; available {available}")
