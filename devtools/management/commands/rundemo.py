from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from argparse import ArgumentParser
from typing import Any

from core.commands import SpeedInferCommand
from devtools.demo import simulator_port, triton_port
from devtools.tritonserver import TritonServer, triton_installed


def _wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


class Command(SpeedInferCommand):
    help = (
        "Serve the whole embedded product on one machine: the gateway, the probe/sweep schedule, the "
        "bundled worker simulator and, where `make triton` installed it, a real Triton worker. Used by `make run`."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--host", default="127.0.0.1")

    def _start_triton(self) -> TritonServer | None:
        """The demo's direct Triton worker, where `make triton` installed the real server."""
        if not triton_installed():
            return None
        try:
            server = TritonServer(port=triton_port()).start(timeout=60)
        except RuntimeError as exc:
            self.stderr.write(f"Triton demo worker not started: {str(exc).splitlines()[0]}")
            return None
        self.stdout.write(f"Triton demo workers at {server.url} (models acme/triton-demo, acme/triton-stream-demo)")
        return server

    def run(self, *args: Any, **options: Any) -> None:
        # A SIGTERM (a supervisor, `kill`) stops the children too, as Ctrl-C does.
        signal.signal(signal.SIGTERM, _interrupt)
        python = sys.executable
        port = simulator_port()
        children = [
            # The demo's GPU worker: an OpenAI-compatible simulator that streams a token every 25 ms.
            subprocess.Popen(  # noqa: S603 (our own interpreter and module)
                [python, "-m", "devtools.simulator", "--port", str(port), "--delay-ms", "25"]
            ),
        ]
        _wait_for_port(port)  # so the schedule's first probe finds it up
        triton = self._start_triton()
        children.append(subprocess.Popen([python, "manage.py", "runschedule"]))  # noqa: S603
        try:
            server = subprocess.Popen(  # noqa: S603
                # The production server and its SIGTERM drain (manage.py serve), in one process.
                [python, "manage.py", "serve", "--host", options["host"], "--port", str(options["port"])]
            )
            children.append(server)
            self.stdout.write(f"SpeedInfer at http://{options['host']}:{options['port']}/ (Ctrl-C stops)")
            server.wait()
        except KeyboardInterrupt:
            pass
        finally:
            if triton is not None:
                triton.stop()
            for child in children:
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)
            for child in children:
                try:
                    child.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    child.kill()
