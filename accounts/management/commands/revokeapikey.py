from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from accounts.selectors import api_key_resolve
from accounts.services import api_key_revoke
from core.commands import SpeedInferCommand


class Command(SpeedInferCommand):
    help = "Revoke an API key by its prefix (sk-si-xxxxxxxxxxxx) or its name. Takes effect within seconds."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("key", metavar="PREFIX_OR_NAME")

    def run(self, *args: Any, **options: Any) -> None:
        api_key = api_key_resolve(ref=options["key"])
        if api_key is None:
            raise CommandError(f"key: no single key matches {options['key']!r}")
        api_key_revoke(api_key=api_key, actor="manage.py revokeapikey", via="command")
        self.stdout.write(f"Revoked key {api_key.name!r} ({api_key.prefix})")
