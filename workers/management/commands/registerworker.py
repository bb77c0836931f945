from __future__ import annotations

import json
import sys
from argparse import ArgumentParser
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import CommandError

from core.commands import SpeedInferCommand, _one_line
from workers.services import worker_register


class Command(SpeedInferCommand):
    help = (
        "Create or update workers from the spec's registration JSON (one object, or a list of them, per file; "
        "'-' reads standard input). Idempotent: registering the same document again changes nothing."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("files", nargs="+", metavar="FILE", help="registration JSON file, or - for stdin")

    def run(self, *args: Any, **options: Any) -> None:
        documents: list[tuple[str, Any]] = []
        # Read and parse everything first so a bad file registers nothing.
        for name in options["files"]:
            documents.extend((name, doc) for doc in self._read(name))
        for name, doc in documents:
            try:
                worker, created = worker_register(data=doc, actor="manage.py registerworker", via="command")
            except ValidationError as exc:
                label = doc.get("worker_id") if isinstance(doc, dict) else None
                prefix = f"{name}" + (f" ({label})" if isinstance(label, str) else "")
                raise CommandError(f"{prefix}: {_one_line(exc)}") from None
            verb = "created" if created else "updated"
            self.stdout.write(f"{verb} worker {worker.worker_id} ({worker.runtime}, transport {worker.transport})")

    def _read(self, name: str) -> list[Any]:
        try:
            if name == "-":
                text = sys.stdin.read()
            else:
                with open(name, encoding="utf-8") as handle:
                    text = handle.read()
        except OSError as exc:
            raise CommandError(f"{name}: cannot read: {exc.strerror}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CommandError(f"{name}: not valid JSON: {exc.msg} at line {exc.lineno}") from None
        return data if isinstance(data, list) else [data]
