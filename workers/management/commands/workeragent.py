from __future__ import annotations

import os
from argparse import ArgumentParser
from typing import Any
from urllib.parse import urlsplit

from django.core.management.base import CommandError

from core.commands import SpeedInferCommand
from workers.agent import DEFAULT_INTERVAL, AgentError, WorkerAgent, registration_load

KEY_ENVIRONMENT = "SPEEDINFER_AGENT_KEY"


class Command(SpeedInferCommand):
    help = (
        "Run on a GPU host: register the worker in FILE through the staff API of the SpeedInfer at --api, with GPU "
        "metadata read from NVML (never a serial number or UUID) and the local runtime's readiness, then again "
        "every --interval seconds. Needs no database or Redis. The key may also come from the environment "
        f"variable {KEY_ENVIRONMENT}, which keeps it out of the process list."
    )
    # A GPU host has no database: the system checks have nothing to check there.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("file", metavar="FILE", help="the worker's registration JSON (one object)")
        parser.add_argument("--api", required=True, metavar="URL", help="SpeedInfer's base URL, e.g. http://host:8000")
        parser.add_argument(
            "--key", metavar="KEY", help=f"an admin-scope API key (default: ${KEY_ENVIRONMENT})", default=None
        )
        parser.add_argument(
            "--interval",
            type=float,
            default=DEFAULT_INTERVAL,
            metavar="SECONDS",
            help=f"seconds between reports (default {DEFAULT_INTERVAL:g})",
        )
        parser.add_argument("--once", action="store_true", help="report once and exit (1 when it failed)")

    def run(self, *args: Any, **options: Any) -> None:
        api = str(options["api"]).rstrip("/")
        parts = urlsplit(api)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CommandError(f"--api: must be an http:// or https:// base URL, got {api!r}")
        key = options["key"] or os.environ.get(KEY_ENVIRONMENT, "")
        if not key:
            raise CommandError(f"--key: required (or set {KEY_ENVIRONMENT})")
        interval = float(options["interval"])
        if not 1 <= interval <= 3600:
            raise CommandError(f"--interval: must be between 1 and 3600 seconds, got {interval:g}")
        try:
            doc = registration_load(options["file"])
        except AgentError as exc:
            raise CommandError(str(exc)) from None
        agent = WorkerAgent(
            api=api,
            key=key,
            doc=doc,
            interval=interval,
            out=lambda line: self.stdout.write(line) if options["verbosity"] > 0 else None,
            err=self.stderr.write,
        )
        try:
            agent.run(once=options["once"])
        except AgentError as exc:
            raise CommandError(str(exc)) from None
        except KeyboardInterrupt:
            return
