from __future__ import annotations

import getpass
import os
import sys
from argparse import ArgumentParser
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from accounts.models import Role
from accounts.selectors import account_resolve
from accounts.services import member_add
from core.commands import SpeedInferCommand


class Command(SpeedInferCommand):
    help = (
        "Add a member to an account (or change an existing member's role) with a dashboard login at EMAIL, "
        "and print the email on the last line. Roles: owner (members, keys, budgets), developer (keys and "
        "usage), viewer (usage only). A new login's password comes from SPEEDINFER_PASSWORD or a prompt; "
        "an existing login keeps its password."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("account", help="account id or name")
        parser.add_argument("email", help="the member's dashboard login")
        parser.add_argument("--role", required=True, help="owner, developer or viewer")

    def run(self, *args: Any, **options: Any) -> None:
        account = account_resolve(ref=options["account"])
        if account is None:
            raise CommandError(f"account: no account {options['account']!r}")
        if options["role"] not in Role.values:
            raise CommandError(f"role: unknown role {options['role']!r}; choose from {', '.join(Role.values)}")
        email = options["email"].strip().lower()
        password = ""
        # Only a new login needs a password; an existing user keeps theirs and is never prompted.
        if not get_user_model().objects.filter(username=email).exists():
            password = os.environ.get("SPEEDINFER_PASSWORD", "")
            if not password and "@" in email:
                if not sys.stdin.isatty():
                    raise CommandError("password: set SPEEDINFER_PASSWORD (no terminal to prompt on)")
                password = getpass.getpass(f"Password for {email}: ")
        change = member_add(
            account=account,
            email=email,
            role=options["role"],
            password=password,
            actor="manage.py addmember",
            via="command",
        )
        membership = change.membership
        if change.role_before is None:
            self.stdout.write(f"Added {membership.role} to {account.name!r}")
        elif change.role_before != membership.role:
            self.stdout.write(f"Changed role in {account.name!r} from {change.role_before} to {membership.role}")
        else:
            self.stdout.write(f"Already a {membership.role} of {account.name!r}")
        self.stdout.write(membership.user.get_username())
