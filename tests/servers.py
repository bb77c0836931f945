"""Real servers for the gateway tests: the ASGI app under uvicorn, and the worker simulator.

The gateway runs in a thread of the test process, so it shares the test
database's settings; tests that use it need transactional_db (its requests
commit on their own connections).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from devtools.simulator import Behaviour, Simulator, SimulatorThread


class GatewayServer:
    """speedinfer.asgi:application under uvicorn on 127.0.0.1 and a free port, in a daemon thread."""

    def __init__(self) -> None:
        from speedinfer.asgi import application

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(application, log_level="warning", access_log=False, lifespan="on")
        self.server = uvicorn.Server(config)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._run, name="gateway", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.server.serve(sockets=[self.sock]))

    def start(self) -> GatewayServer:
        self.thread.start()
        for _ in range(500):
            if self.server.started:
                return self
            threading.Event().wait(0.01)
        raise RuntimeError("the gateway did not start")

    def run_on_loop(self, coro: Any) -> Any:
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def stop(self) -> None:
        from asgiref.sync import sync_to_async
        from django.db import connections

        # The app's database thread keeps connections open; the test database can't be dropped under them.
        self.run_on_loop(sync_to_async(connections.close_all)())
        self.server.should_exit = True
        self.thread.join(10)
        # Threads the app ran queries on with thread_sensitive=False (the routing snapshot) hold
        # connections nobody can close from here: end those sessions so the test database can go.
        from django.db import connection

        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )


@pytest.fixture(scope="session")
def gateway_server(django_db_setup: None, django_db_blocker: Any) -> Iterator[GatewayServer]:
    with django_db_blocker.unblock():
        server = GatewayServer().start()
        yield server
        server.stop()


@pytest.fixture(scope="session")
def simulator() -> Iterator[SimulatorThread]:
    thread = SimulatorThread(Simulator(models=("acme/model-1", "upstream/model-1"))).start()
    yield thread
    thread.stop()


@pytest.fixture
def simulator_factory() -> Iterator[Any]:
    started: list[SimulatorThread] = []

    def start(**behaviour: Any) -> SimulatorThread:
        thread = SimulatorThread(Simulator(behaviour=Behaviour(**behaviour))).start()
        started.append(thread)
        return thread

    yield start
    for thread in started:
        thread.stop()


def register_worker(
    endpoint: str,
    *,
    worker_id: str = "sim-1",
    models: tuple[str, ...] = ("acme/model-1",),
    runtime: str = "cuda",
    probe: bool = True,
    **runtime_config: Any,
) -> Any:
    """Register a worker through the workers service and probe it for real, as the schedule would."""
    from workers import routing
    from workers.models import Worker
    from workers.services import worker_register, workers_probe

    config = {"transport": "openai", **runtime_config} if runtime != "triton" else runtime_config
    worker, _ = worker_register(
        data={
            "worker_id": worker_id,
            "worker_type": "nvidia-gpu",
            "runtime": runtime,
            "runtime_endpoint": endpoint,
            "supported_models": list(models),
            "runtime_config": config,
        }
    )
    if probe:
        workers_probe(workers=[worker])
    routing.invalidate()
    return Worker.objects.get(pk=worker.pk)


@pytest.fixture(autouse=False)
def fresh_gateway() -> Iterator[None]:
    """Each test's models and workers are new rows: drop the gateway's per-process caches."""
    from catalog import cache as catalog
    from workers import routing

    catalog.forget()
    routing.invalidate()
    yield
    catalog.forget()
    routing.invalidate()


def stream_events(base_url: str, path: str, secret: str, payload: dict[str, Any]) -> list[tuple[float, bytes]]:
    """(seconds since the request, data payload) of every SSE event of a streamed /v1 answer, read with a
    plain HTTP client as it arrives."""
    events = []
    started = time.perf_counter()
    with httpx.stream(
        "POST", base_url + path, json=payload, headers={"Authorization": f"Bearer {secret}"}, timeout=10
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append((time.perf_counter() - started, line[6:].encode()))
    return events
