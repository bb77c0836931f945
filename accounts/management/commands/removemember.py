from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from accounts.selectors import account_resolve, membership_by_email
from accounts.services import member_remove
from core.commands import SpeedInferCommand


class Command(SpeedInferCommand):
    help = (
        "Remove a member from an account; their dashboard sessions stop working at once. The account's last "
        "owner cannot be removed. The login itself is kept (it may be added again with addmember)."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("account", help="account id or name")
        parser.add_argument("email", help="the member's dashboard login")

    def run(self, *args: Any, **options: Any) -> None:
        account = account_resolve(ref=options["account"])
        if account is None:
            raise CommandError(f"account: no account {options['account']!r}")
        membership = membership_by_email(account=account, email=options["email"])
        if membership is None:
            raise CommandError(f"email: {options['email']!r} is not a member of {account.name!r}")
        member_remove(membership=membership, actor="manage.py removemember", via="command")
        self.stdout.write(f"Removed {membership.user.get_username()} from {account.name!r}")
