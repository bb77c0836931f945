from __future__ import annotations

from argparse import ArgumentParser
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError

from billing.services import reservations_expire
from core.commands import SpeedInferCommand


class Command(SpeedInferCommand):
    help = "Release reservations held longer than a limit (their request's process died); prints how many."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--older-than",
            type=int,
            default=None,
            metavar="SECONDS",
            help=f"default: SPEEDINFER_RESERVATION_TTL ({settings.SPEEDINFER_RESERVATION_TTL})",
        )

    def run(self, *args: Any, **options: Any) -> None:
        seconds = options["older_than"]
        if seconds is None:
            seconds = settings.SPEEDINFER_RESERVATION_TTL
        if seconds < 0:
            raise CommandError(f"older-than: must not be negative: {seconds}")
        self.stdout.write(str(reservations_expire(older_than=timedelta(seconds=seconds))))
