"""A base for SpeedInfer's management commands: one-line errors, exit status 1."""

from __future__ import annotations

import sys
from argparse import ArgumentParser
from typing import Any, NoReturn

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import OperationalError


def _one_line(exc: ValidationError) -> str:
    if hasattr(exc, "error_dict"):
        field, errors = next(iter(exc.error_dict.items()))
        messages = [m for e in errors for m in e.messages]
        return f"{field}: {messages[0] if messages else 'invalid'}"
    return exc.messages[0] if exc.messages else "invalid value"


class _Parser(CommandParser):
    def error(self, message: str) -> NoReturn:
        if not self.called_from_command_line:
            raise CommandError(message)
        # argparse would print its usage (several lines) and exit 2; the contract says one
        # line and exit 1, the same shape as every other command error. Django parses the
        # arguments outside its CommandError handler, so the line is written here.
        sys.stderr.write(f"CommandError: {message} (see {self.prog} --help)\n")
        sys.exit(1)


class SpeedInferCommand(BaseCommand):
    """Subclasses implement run(); ValidationError becomes `CommandError: field: message`."""

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.__class__ = _Parser
        return parser

    def add_arguments(self, parser: ArgumentParser) -> None:
        pass

    def handle(self, *args: Any, **options: Any) -> str | None:
        try:
            return self.run(*args, **options)
        except ValidationError as exc:
            raise CommandError(_one_line(exc)) from None
        except OperationalError as exc:
            # A database that is down or missing is the operator's DATABASE_URL, not a bug: one line, exit 1.
            detail = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            raise CommandError(f"DATABASE_URL: the database cannot be used: {detail}") from None

    def run(self, *args: Any, **options: Any) -> str | None:
        raise NotImplementedError
