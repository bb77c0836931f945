from __future__ import annotations

import getpass
import os
import sys
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from accounts.services import account_create, account_user_create
from core.commands import SpeedInferCommand


class Command(SpeedInferCommand):
    help = (
        "Create a customer account and print its id on the last line. With --owner, also create that "
        "customer's dashboard login; its password comes from SPEEDINFER_PASSWORD or a prompt."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("name", help="the account's unique name")
        parser.add_argument("--owner", metavar="EMAIL", help="create a dashboard login for this email")

    def run(self, *args: Any, **options: Any) -> None:
        from django.db import transaction

        password = ""
        if options["owner"]:
            password = os.environ.get("SPEEDINFER_PASSWORD", "")
            if not password:
                if not sys.stdin.isatty():
                    raise CommandError("password: set SPEEDINFER_PASSWORD (no terminal to prompt on)")
                password = getpass.getpass(f"Password for {options['owner']}: ")
        with transaction.atomic():
            account = account_create(name=options["name"], actor="manage.py createaccount", via="command")
            if options["owner"]:
                account_user_create(account=account, email=options["owner"], password=password)
        self.stdout.write(f"Created account {account.name!r}")
        self.stdout.write(str(account.pk))
