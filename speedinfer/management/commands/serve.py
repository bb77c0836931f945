"""`manage.py serve`: the whole gateway (speedinfer.asgi:application) under the production HTTP server.

The server is uvicorn with uvloop and httptools, chosen by measurement against granian and daphne (README,
"Running in production"). SIGTERM (or Ctrl-C) stops accepting connections, lets the requests in flight
finish (streams included) for up to --graceful-timeout seconds, runs the ASGI lifespan shutdown (the
upstream clients, the database pool and the fleet's Redis keys are closed and withdrawn), then exits 0.
"""

from __future__ import annotations

import logging
import os
import resource
import shutil
import signal
import tempfile
from argparse import ArgumentParser, ArgumentTypeError
from typing import Any

from django.core.management.base import CommandError

from core.commands import SpeedInferCommand

log = logging.getLogger("speedinfer.serve")

APPLICATION = "speedinfer.asgi:application"


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise ArgumentTypeError(f"must be an integer from 1 to 65535 (--port, or $PORT), not {value!r}") from None
    if not 1 <= port <= 65535:
        raise ArgumentTypeError(f"must be an integer from 1 to 65535 (--port, or $PORT), not {value!r}")
    return port


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ArgumentTypeError(f"must be a positive integer, not {value!r}") from None
    if number < 1:
        raise ArgumentTypeError(f"must be a positive integer, not {value!r}")
    return number


def _default_port() -> str:
    # A string default goes through the argument's type, so a bad PORT is one line like a bad --port.
    return os.environ.get("PORT", "8000")


def raise_open_files_limit() -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (every open stream holds two sockets,
    client and upstream; distributions default the soft limit to 1,024). Returns (soft, hard) as set."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if target == resource.RLIM_INFINITY:
        # Linux refuses an infinite RLIMIT_NOFILE; the kernel's per-process ceiling is the real bound.
        try:
            with open("/proc/sys/fs/nr_open") as f:
                target = int(f.read())
        except (OSError, ValueError):
            target = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open files limit from %s to %s: %s", soft, target, exc)
    return soft, hard


def _stopped(signum: int, frame: Any) -> None:
    log.info("stopped by signal %s", signum)


class Command(SpeedInferCommand):
    help = (
        "Serve the whole gateway (speedinfer.asgi:application: /v1, the dashboard, the admin, the live feed and "
        "static files) with uvicorn (uvloop, httptools) in N processes until SIGTERM, which drains the requests "
        "in flight and exits 0. Raises the open files soft limit to the hard limit first."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
        parser.add_argument(
            "--port", type=_port, default=_default_port(), help="port to listen on (default: $PORT, else 8000)"
        )
        parser.add_argument(
            "--workers",
            type=_positive,
            default=1,
            help="gateway processes sharing the port (default 1; one per core in production)",
        )
        parser.add_argument(
            "--graceful-timeout",
            type=_positive,
            default=30,
            help="seconds SIGTERM waits for requests in flight before closing them (default 30)",
        )
        parser.add_argument(
            "--access-log", action="store_true", help="uvicorn's access log (off: the gateway logs each /v1 request)"
        )

    def run(self, *args: Any, **options: Any) -> None:
        import uvicorn

        host: str = options["host"]
        port: int = options["port"]  # argparse passes the PORT default through _port too
        workers: int = options["workers"]
        soft, hard = raise_open_files_limit()
        self.stdout.write(f"open files limit: {soft} (hard {'unlimited' if hard == resource.RLIM_INFINITY else hard})")
        metrics_dir = None
        if workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            # Several processes: /metrics must report all of them, not whichever one the scrape reached.
            # The worker processes are spawned, so they read this before prometheus_client loads.
            metrics_dir = tempfile.mkdtemp(prefix="speedinfer-metrics-")
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
        self.stdout.write(f"SpeedInfer serving at http://{host}:{port}/ with {workers} process(es) (uvicorn)")
        self.stdout.flush()
        # uvicorn re-raises the signal that stopped it once it has shut down, which would make a drained
        # SIGTERM exit -15: a handler of our own receives that re-raise, so a clean stop exits 0.
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, _stopped)
        try:
            uvicorn.run(
                APPLICATION,
                host=host,
                port=port,
                workers=workers,
                loop="uvloop",
                http="httptools",
                ws="websockets-sansio",
                lifespan="on",
                access_log=options["access_log"],
                timeout_graceful_shutdown=options["graceful_timeout"],
                # The gateway's own logging (settings.LOGGING) stays; uvicorn adds only its own loggers.
                log_level=os.environ.get("LOG_LEVEL", "info").lower(),
                server_header=False,
                proxy_headers=False,
            )
        except OSError as exc:  # the port is taken, the address is not ours
            raise CommandError(f"--port: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        finally:
            if metrics_dir is not None:
                shutil.rmtree(metrics_dir, ignore_errors=True)
