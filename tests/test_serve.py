"""`manage.py serve` (CONTRACT, "Serving in production"): the gateway as outside tests and benchmarks start it,
and the fleet's Redis keys, which must not grow with gateway restarts."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.test import Client

from accounts.services import account_user_create
from devtools.simulator import SimulatorThread
from tests.factories import make_account, make_key, make_model
from tests.servers import register_worker
from workers import fleet

ROOT = Path(__file__).resolve().parent.parent
MODEL = "acme/model-1"

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fleet_keys() -> list[bytes]:
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    # This test process's own in-process gateway (the live server other tests share) keeps its entry:
    # only what the served processes wrote counts.
    mine = fleet.PROCESS.encode()
    try:
        found = []
        for key in sorted(client.scan_iter(match=f"{fleet.processes_key()[: -len('procs')]}*")):
            if key == fleet.processes_key().encode():
                if {m for m in client.smembers(key) if m != mine}:
                    found.append(key)
            elif not key.endswith(mine):
                found.append(key)
        return found
    finally:
        client.close()


@pytest.fixture
def served(subprocess_env: dict[str, str], tmp_path: Path) -> Iterator[Any]:
    """A simulator worker, a key with credits, and a function that starts `manage.py serve` on a free port."""
    simulator = SimulatorThread().start()
    make_model(model_id=MODEL, max_output_tokens=64)
    account = make_account(name="serve", credits=1000)
    secret = make_key(account=account).secret
    register_worker(simulator.base_url)
    started: list[subprocess.Popen[bytes]] = []

    def serve(*args: str) -> tuple[subprocess.Popen[bytes], str, Path]:
        port = free_port()
        log = tmp_path / f"serve-{port}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(  # noqa: S603
                [sys.executable, "manage.py", "serve", "--port", str(port), *args],
                cwd=ROOT,
                env={**subprocess_env, "SPEEDINFER_VAR_DIR": str(tmp_path), "SPEEDINFER_PROBE_INTERVAL": "3600"},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        started.append(proc)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    return proc, base, log
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"serve did not answer /health:\n{log.read_text()[-3000:]}")

    serve.secret = secret  # type: ignore[attr-defined]
    serve.account = account  # type: ignore[attr-defined]
    try:
        yield serve
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def chat(base: str, secret: str, text: str = "Hello there", timeout: float = 30) -> httpx.Response:
    return httpx.post(
        f"{base}/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": text}]},
        headers={"Authorization": f"Bearer {secret}"},
        timeout=timeout,
    )


def test_serve_answers_health_and_a_completion_and_drains_a_slow_request_on_sigterm(served):
    proc, base, log = served()
    health = httpx.get(f"{base}/health", timeout=5).json()
    assert health["status"] == "ok" and [w["worker_id"] for w in health["workers"]] == ["sim-1"]
    reply = chat(base, served.secret)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] > 0
    assert "open files limit:" in log.read_text()

    # A request that takes 3 s upstream is in flight when SIGTERM arrives: it completes, then serve exits 0.
    result: dict[str, Any] = {}
    slow = threading.Thread(target=lambda: result.setdefault("reply", chat(base, served.secret, "[sim latency=3000]")))
    slow.start()
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    slow.join(30)
    assert result["reply"].status_code == 200, result["reply"].text
    assert result["reply"].json()["usage"]["completion_tokens"] > 0
    assert proc.wait(30) == 0, log.read_text()[-3000:]
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", int(base.rsplit(":", 1)[1]))) != 0
    if settings.REDIS_URL:
        assert fleet_keys() == []  # the stopped process withdrew its counts and its entry


def test_serve_with_two_workers_serves_from_both_and_stops_cleanly(served):
    proc, base, log = served("--workers", "2")
    replies = [chat(base, served.secret) for _ in range(12)]
    assert [r.status_code for r in replies] == [200] * 12
    # Two processes listen: each child of the supervisor is a gateway process.
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert len(children) >= 2, children
    result: dict[str, Any] = {}
    slow = threading.Thread(target=lambda: result.setdefault("reply", chat(base, served.secret, "[sim latency=2000]")))
    slow.start()
    time.sleep(0.7)
    proc.send_signal(signal.SIGTERM)  # the supervisor stops both processes; the one with the request drains it
    slow.join(30)
    assert result["reply"].status_code == 200, result["reply"].text
    assert proc.wait(30) == 0, log.read_text()[-3000:]
    if settings.REDIS_URL:
        assert fleet_keys() == []


def test_the_live_feed_websocket_works_under_serve(served):
    """The dashboard's live feed (a WebSocket with the session cookie) through serve's HTTP server, and a
    SIGTERM with the socket open still exits 0."""
    from websockets.sync.client import connect

    proc, base, log = served()
    account_user_create(account=served.account, email="owner@example.com", password="correct horse battery")
    client = Client()
    assert client.login(username="owner@example.com", password="correct horse battery")
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    ws_url = base.replace("http://", "ws://") + "/ws/usage/"
    with connect(ws_url, additional_headers={"Cookie": cookie, "Origin": base}, open_timeout=10) as ws:
        reply = chat(base, served.secret)
        assert reply.status_code == 200, reply.text
        deadline = time.monotonic() + 15
        message: dict[str, Any] = {}
        while time.monotonic() < deadline and message.get("usage", {}).get("model") != MODEL:
            message = json.loads(ws.recv(timeout=deadline - time.monotonic()))  # another run's account 1: skipped
        assert message["type"] == "usage" and message["usage"]["model"] == MODEL, message
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()[-3000:]


def test_bad_serve_arguments_are_one_line_errors(subprocess_env):
    cases = ((["--workers", "0"], "--workers"), (["--port", "70000"], "--port"), (["--port", "x"], "--port"))
    for args, field in cases:
        done = subprocess.run(  # noqa: S603
            [sys.executable, "manage.py", "serve", *args],
            cwd=ROOT,
            env=subprocess_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and field in lines[0] and "Traceback" not in done.stderr, done.stderr


@pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="the fleet's keys live in Redis")
def test_gateway_restarts_leave_nothing_growing_in_redis(db, monkeypatch):
    """Fifty gateway processes come and go, one at a time (half stop cleanly, half are killed): the set of
    processes holds only live ones, and once the last is gone every key the fleet wrote has expired."""
    import redis.asyncio as aioredis

    monkeypatch.setattr(fleet, "TTL_S", 0.2)
    monkeypatch.setattr(fleet, "PROCS_TTL_S", 1.0)

    async def main() -> list[int]:
        sizes: list[int] = []
        async with aioredis.Redis.from_url(settings.REDIS_URL) as client:
            survivor = "gateway-survivor"
            known: list[str] = []
            for n in range(50):
                process = f"gateway-{n}"
                await fleet.sync_once(client, process=process, counts={"w1": 3}, known=[])
                known, _ = await fleet.sync_once(client, process=survivor, counts={"w1": 1}, known=known)
                if n % 2:
                    await fleet.withdraw(client, process=process)  # a clean shutdown
                else:
                    await asyncio.sleep(0.25)  # killed: its hash expires, the survivor's next sync prunes it
                known, _ = await fleet.sync_once(client, process=survivor, counts={"w1": 1}, known=known)
                known, _ = await fleet.sync_once(client, process=survivor, counts={"w1": 1}, known=known)
                sizes.append(await client.scard(fleet.processes_key()))
            await asyncio.sleep(1.2)  # the survivor is killed too: the set expires after PROCS_TTL_S
        return sizes

    sizes = asyncio.run(main())
    assert max(sizes) <= 2 and sizes[-1] == 1, sizes
    assert fleet_keys() == []
