"""A local tritonserver process, from nvidia-pytriton's build installed by `make triton`.

The tests start it over tests/triton_models (see tests/triton_server.py), and `make run` starts one for
the demo's Triton worker when it is installed. See README, Workers, for why it lives in a venv of its own.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

REPOSITORY = Path(__file__).resolve().parent.parent / "tests" / "triton_models"
TRITON_VENV = Path(os.environ.get("SPEEDINFER_TRITON_VENV", Path.home() / ".cache/speedinfer/triton-venv"))
SITE = TRITON_VENV / "lib/python3.11/site-packages"
SERVER_BIN = SITE / "pytriton/tritonserver/bin/tritonserver"
BACKENDS = TRITON_VENV / "backends"


def triton_installed() -> bool:
    return (TRITON_VENV / ".installed").exists() and SERVER_BIN.exists()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TritonServer:
    """One tritonserver process over a model repository; stop() and start() keep the port."""

    def __init__(self, repository: Path = REPOSITORY, port: int | None = None) -> None:
        self.repository = repository
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log = Path(tempfile.mkstemp(prefix="tritonserver-", suffix=".log")[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 90.0) -> TritonServer:
        env = {
            **os.environ,
            # The backend stub finds numpy through the python3 first on PATH.
            "PATH": f"{TRITON_VENV}/bin:{os.environ.get('PATH', '')}",
            "LD_LIBRARY_PATH": f"{SITE}/nvidia_pytriton.libs",
        }
        command = [
            str(SERVER_BIN),
            f"--model-repository={self.repository}",
            f"--backend-directory={BACKENDS}",
            "--http-address=127.0.0.1",
            f"--http-port={self.port}",
            "--allow-grpc=false",
            "--allow-metrics=false",
            "--exit-timeout-secs=5",
        ]
        with self.log.open("ab") as log:
            # The binary and arguments are our own (the venv `make triton` built), never user input.
            self.process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)  # noqa: S603
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tritonserver exited {self.process.returncode}:\n{self.tail()}")
            try:
                if httpx.get(f"{self.url}/v2/health/ready", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"tritonserver not ready after {timeout}s:\n{self.tail()}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)
        # The port is free once nothing accepts there any more.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{self.url}/v2/health/live", timeout=0.5)
            except httpx.HTTPError:
                return
            time.sleep(0.1)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
