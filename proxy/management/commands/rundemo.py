from __future__ import annotations

import os
import signal
import subprocess
import sys
from argparse import ArgumentParser
from typing import Any

from speedinfer.commands import SpeedInferCommand


class Command(SpeedInferCommand):
    help = (
        "Serve the whole embedded product on one machine: the gateway, the probe/sweep schedule and the "
        "bundled worker simulator. Used by `make run`."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--host", default="127.0.0.1")

    def run(self, *args: Any, **options: Any) -> None:
        python = sys.executable
        children = [
            subprocess.Popen([python, "manage.py", "runschedule"]),  # noqa: S603 (our own interpreter and script)
        ]
        try:
            server = subprocess.Popen(  # noqa: S603
                [
                    python,
                    "-m",
                    "uvicorn",
                    "speedinfer.asgi:application",
                    "--host",
                    options["host"],
                    "--port",
                    str(options["port"]),
                    "--no-access-log",
                ]
            )
            children.append(server)
            self.stdout.write(f"SpeedInfer at http://{options['host']}:{options['port']}/ (Ctrl-C stops)")
            server.wait()
        except KeyboardInterrupt:
            pass
        finally:
            for child in children:
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)
            for child in children:
                try:
                    child.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    child.kill()
