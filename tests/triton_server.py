"""A real Triton Inference Server for the tests (pytest plugin, registered in tests/conftest.py).

`make triton` installs nvidia-pytriton's tritonserver into its own venv (see docs/testing.md, The real Triton server).
Fixtures:
- `triton_server` (session): one server over tests/triton_models, on a free port; `.url` is the base URL.
- `triton_factory`: start extra servers a test may stop and restart (same port), stopped after the test.
Under xdist each worker process starts its own server (about 45 MB each).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from devtools.tritonserver import TRITON_VENV, TritonServer, triton_installed

__all__ = ["TritonServer", "triton_installed"]


def _require_triton() -> None:
    if triton_installed():
        return
    if os.environ.get("SPEEDINFER_SKIP_TRITON") == "1":
        pytest.skip("SPEEDINFER_SKIP_TRITON=1 and the Triton venv is missing")
    # Deliberately a failure, not a skip: CI must not pass without the real server. `make test` installs it.
    pytest.fail(f"the real Triton server is not installed at {TRITON_VENV}: run `make triton`")


@pytest.fixture(scope="session")
def triton_server() -> Iterator[TritonServer]:
    _require_triton()
    server = TritonServer().start()
    yield server
    server.stop()


@pytest.fixture
def triton_factory() -> Iterator[Callable[[], TritonServer]]:
    _require_triton()
    servers: list[TritonServer] = []

    def start() -> TritonServer:
        server = TritonServer().start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
