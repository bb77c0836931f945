"""`make bench`: what SpeedInfer adds to a request, against the same upstream called directly.

Every scenario runs the direct path and the gateway path interleaved in rounds on
the same machine, so the figures that matter are differences and ratios, not the
absolute times of a noisy 2-core box. See README "Performance" for how to read it.

    python bench/run.py [--profiles full,embedded] [--servers serve,uvicorn,granian,daphne] [--quick] [--soak 300]
    python bench/run.py --no-peers                            # without the peers (Portkey, LiteLLM) beside SpeedInfer
    python bench/run.py --peers portkey                       # only Portkey beside SpeedInfer
    python bench/run.py --routing [--routing-seconds 10]   # only the routing scenario
    python bench/run.py --tracing                             # only tracing off vs on (OTLP to a local receiver)
    python bench/run.py --streams 500,2000 --profiles full  # only the load-held scenario (slow streams)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PY = sys.executable
VENV_BIN = Path(PY).parent
MODEL = "bench/model"
TRITON_MODEL = "bench/triton-stream"
PG_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/speedinfer_bench")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/15")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port} after {timeout}s")


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]

    def pids(self) -> list[int]:
        """The process and its children (uvicorn/granian workers)."""
        pids = [self.popen.pid]
        with contextlib.suppress(FileNotFoundError):
            children = subprocess.run(
                ["pgrep", "-P", str(self.popen.pid)], capture_output=True, text=True, check=False
            ).stdout.split()
            pids += [int(c) for c in children]
        return pids

    def rss_kib(self) -> int:
        """Resident size of the process and its children."""
        total = 0
        for pid in self.pids():
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            except FileNotFoundError:
                continue
        return total

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the process and its children have used: a per-request cost that a
        busy machine distorts far less than wall-clock latency."""
        ticks = 0
        for pid in self.pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except FileNotFoundError:
                continue
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
        return ticks / os.sysconf("SC_CLK_TCK")

    def open_files(self) -> int:
        """Open file descriptors of the process and its children."""
        total = 0
        for pid in self.pids():
            with contextlib.suppress(FileNotFoundError):
                total += len(os.listdir(f"/proc/{pid}/fd"))
        return total

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def start(name: str, cmd: list[str], env: dict[str, str], *, port: int, cpus: str | None = None) -> Proc:
    if cpus and shutil.which("taskset"):
        cmd = ["taskset", "-c", cpus, *cmd]
    # Logs go to a file, as in production: a pipe nobody reads would fill and stall the server.
    log_path = Path(env["SPEEDINFER_VAR_DIR"]) / f"{name}-{port}.log"
    with log_path.open("wb") as log:
        popen = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)  # noqa: S603
    try:
        wait_port(port)
    except RuntimeError:
        popen.kill()
        raise RuntimeError(f"{name} did not start:\n{log_path.read_text(errors='replace')[-2000:]}") from None
    return Proc(name, popen)


def manage(env: dict[str, str], *args: str, stdin: str | None = None) -> str:
    proc = subprocess.run(  # noqa: S603
        [PY, "manage.py", *args], cwd=ROOT, env=env, input=stdin, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


# ---------------------------------------------------------------------------- set-up


def profile_env(profile: str, var_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(
        SECRET_KEY="bench-secret",
        DEBUG="0",
        ALLOWED_HOSTS="*",
        LOG_LEVEL="WARNING",
        SPEEDINFER_VAR_DIR=str(var_dir),
        SPEEDINFER_PROBE_INTERVAL="3600",
        PYTHONUNBUFFERED="1",
    )
    if profile == "full":
        env.update(DATABASE_URL=PG_URL, REDIS_URL=REDIS_URL)
    return env


def reset_stores(profile: str) -> None:
    if profile != "full":
        return
    import psycopg
    import redis

    base, _, name = PG_URL.rpartition("/")
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    redis.Redis.from_url(REDIS_URL).flushdb()


def register(env: dict[str, str], worker_id: str, upstream: str, **runtime_config: str) -> None:
    worker = {
        "worker_id": worker_id,
        "worker_type": "nvidia-gpu",
        "runtime": "cuda",
        "runtime_endpoint": upstream,
        "supported_models": [MODEL],
        "runtime_config": {"transport": "openai", **runtime_config},
    }
    manage(env, "registerworker", "-", stdin=json.dumps(worker))


def seed(env: dict[str, str], upstream: str | None) -> str:
    """The bench account, model, key and one worker (when `upstream` is given); returns the key's secret."""
    manage(env, "migrate", "--noinput", "-v", "0")
    manage(env, "registermodel", MODEL, "--input-price", "0.1", "--output-price", "0.2", "--max-output-tokens", "256")
    manage(env, "createaccount", "bench")
    manage(env, "grantcredits", "bench", "1000000")
    # rpm/tpm are set high rather than left unset so the limiter runs on every request, as in production.
    secret = manage(env, "createapikey", "bench", "--name", "bench", "--rpm", "100000000", "--tpm", "1000000000")
    if upstream is None:
        return secret.strip().splitlines()[-1]
    worker = {
        "worker_id": "bench-sim",
        "worker_type": "nvidia-gpu",
        "runtime": "cuda",
        "runtime_endpoint": upstream,
        "supported_models": [MODEL],
        "runtime_config": {"transport": "openai"},
    }
    manage(env, "registerworker", "-", stdin=json.dumps(worker))
    manage(env, "probeworkers")
    return secret.strip().splitlines()[-1]


SEED_ACCOUNTS = """
import sys
from accounts.services import account_create, api_key_create
from billing.services import credits_grant
for i in range(int(sys.argv[1])):
    account = account_create(name=f"bench-{i}", actor="bench")
    credits_grant(account=account, amount=1_000_000 * 1_000_000, actor="bench")
    key = api_key_create(account=account, name="bench", rpm=100_000_000, tpm=1_000_000_000, actor="bench")
    print(key.secret)
"""


def seed_accounts(env: dict[str, str], n: int) -> list[str]:
    """n more accounts with credits and a key each (one process, not 3n commands); their secrets."""
    out = subprocess.run(  # noqa: S603
        [PY, "manage.py", "shell", "-c", f"import sys; sys.argv = ['', '{n}']\n{SEED_ACCOUNTS}"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return out.split()[-n:]


SERVERS: dict[str, list[str]] = {
    # What production runs (README, "Running in production"): the default, and how outside tests start it.
    "serve": [PY, "manage.py", "serve", "--port", "{port}", "--workers", "{workers}"],
    "uvicorn": [
        PY, "-m", "uvicorn", "speedinfer.asgi:application", "--host", "127.0.0.1", "--port", "{port}",
        "--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning",
        "--workers", "{workers}",
    ],
    "granian": [
        str(VENV_BIN / "granian"), "--interface", "asgi", "--host", "127.0.0.1", "--port", "{port}",
        "--loop", "uvloop", "--log-level", "warning", "--workers", "{workers}", "--no-ws",
        "speedinfer.asgi:application",
    ],
    "daphne": [str(VENV_BIN / "daphne"), "-b", "127.0.0.1", "-p", "{port}", "speedinfer.asgi:application"],
}  # fmt: skip


def server_cmd(server: str, port: int, workers: int) -> list[str]:
    return [part.format(port=port, workers=workers) for part in SERVERS[server]]


# ---------------------------------------------------------------------------- scenarios


def body(*, directive: str = "", stream: bool = False, max_tokens: int = 16, model: str = MODEL) -> dict[str, Any]:
    data: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": f"Say something short. {directive}".strip()}],
    }
    if stream:
        data["stream"] = True
        data["stream_options"] = {"include_usage": True}
    return data


@dataclass
class Target:
    name: str
    port: int
    path: str  # the chat completions path on that server
    key: str = ""
    extra: dict[str, str] = field(default_factory=dict)  # a peer gateway's routing headers

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", **self.extra}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        return headers


def latency_c1(
    direct: Target, gateway: Target, payload: dict[str, Any], *, rounds: int, per_round: int
) -> dict[str, Any]:
    """Concurrency 1 over one kept-alive connection per path, interleaved in rounds."""
    raw = json.dumps(payload).encode()
    samples: dict[str, list[float]] = {"direct": [], "gateway": []}
    conns = {t.name: http.client.HTTPConnection("127.0.0.1", t.port, timeout=30) for t in (direct, gateway)}
    errors = 0

    def once(target: Target) -> float:
        nonlocal errors
        t0 = time.perf_counter()
        try:
            conn = conns[target.name]
            conn.request("POST", target.path, body=raw, headers=target.headers())
            resp = conn.getresponse()
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            # The server closed a connection idle past its keep-alive (a slow round of the other path).
            conns[target.name].close()
            conn = conns[target.name] = http.client.HTTPConnection("127.0.0.1", target.port, timeout=30)
            t0 = time.perf_counter()
            conn.request("POST", target.path, body=raw, headers=target.headers())
            resp = conn.getresponse()
        resp.read()
        elapsed = time.perf_counter() - t0
        if resp.status != 200:
            errors += 1
        return elapsed

    for target in (direct, gateway):  # warm connections, caches and the JIT-less interpreter's paths
        for _ in range(max(20, per_round // 2)):
            once(target)
    for r in range(rounds):
        order = (direct, gateway) if r % 2 == 0 else (gateway, direct)
        for target in order:
            for _ in range(per_round):
                samples[target.name].append(once(target) * 1000)
    for conn in conns.values():
        conn.close()
    d, g = samples["direct"], samples["gateway"]
    return {
        "requests_each": len(d),
        "errors": errors,
        "direct_p50_ms": pct(d, 50),
        "direct_p99_ms": pct(d, 99),
        "gateway_p50_ms": pct(g, 50),
        "gateway_p99_ms": pct(g, 99),
        "added_p50_ms": pct(g, 50) - pct(d, 50),
        "added_p99_ms": pct(g, 99) - pct(d, 99),
    }


def wrk(target: Target, payload: dict[str, Any], *, seconds: int, connections: int = 32) -> dict[str, Any]:
    env = {
        **os.environ,
        "BENCH_BODY": json.dumps(payload),
        "BENCH_AUTH": target.key,
        "BENCH_HEADERS": "\n".join(f"{k}: {v}" for k, v in target.extra.items()),
    }
    cmd = [
        "wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s",
        "-s", str(ROOT / "bench" / "wrk_post.lua"), f"http://127.0.0.1:{target.port}{target.path}",
    ]  # fmt: skip
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout  # noqa: S603
    line = next(ln for ln in out.splitlines() if ln.startswith("BENCH "))
    fields = dict(part.split("=") for part in line.split()[1:])
    duration_s = int(fields["duration_us"]) / 1e6
    return {
        "rps": int(fields["requests"]) / duration_s,
        "p50_ms": int(fields["p50_us"]) / 1000,
        "p99_ms": int(fields["p99_us"]) / 1000,
        "errors": int(fields["non2xx"]) + int(fields["errors"]),
        "requests": int(fields["requests"]),
    }


def throughput(
    direct: Target, gateway: Target, payload: dict[str, Any], *, seconds: int, rounds: int
) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"direct": [], "gateway": []}
    wrk(gateway, payload, seconds=2)  # warm-up
    for r in range(rounds):
        for target in (direct, gateway) if r % 2 == 0 else (gateway, direct):
            runs[target.name].append(wrk(target, payload, seconds=seconds))
    best = {name: max(rs, key=lambda x: x["rps"] if x["errors"] == 0 else -1) for name, rs in runs.items()}
    return {
        "direct_rps": best["direct"]["rps"],
        "gateway_rps": best["gateway"]["rps"],
        "direct_p99_ms": best["direct"]["p99_ms"],
        "gateway_p99_ms": best["gateway"]["p99_ms"],
        "added_p99_ms": best["gateway"]["p99_ms"] - best["direct"]["p99_ms"],
        "gateway_errors": sum(x["errors"] for x in runs["gateway"]),
        "direct_errors": sum(x["errors"] for x in runs["direct"]),
        "runs": runs,
    }


async def _stream_once(session: aiohttp.ClientSession, target: Target, payload: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    ttft = None
    chunks = 0
    gaps: list[float] = []
    last = t0
    usage_before_done = False
    saw_usage = False
    async with session.post(
        f"http://127.0.0.1:{target.port}{target.path}", json=payload, headers=target.headers()
    ) as resp:
        resp.raise_for_status()
        async for raw_line in resp.content:
            line = raw_line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            now = time.perf_counter()
            if data == b"[DONE]":
                usage_before_done = saw_usage
                break
            event = json.loads(data)
            if event.get("usage"):
                saw_usage = True
            if event.get("choices") and event["choices"][0].get("delta", {}).get("content"):
                if ttft is None:
                    ttft = now - t0
                else:
                    gaps.append(now - last)
                chunks += 1
                last = now
    return {
        "ttft_ms": (ttft or float("nan")) * 1000,
        "total_ms": (time.perf_counter() - t0) * 1000,
        "chunks": chunks,
        "max_gap_ms": max(gaps, default=0) * 1000,
        "usage_before_done": usage_before_done,
    }


def streaming(direct: Target, gateway: Target, *, deltas: int, delay_ms: int, rounds: int) -> dict[str, Any]:
    payload = body(directive=f"[sim deltas={deltas} delay={delay_ms}]", stream=True, max_tokens=deltas)

    async def run() -> dict[str, list[dict[str, Any]]]:
        results: dict[str, list[dict[str, Any]]] = {"direct": [], "gateway": []}
        async with aiohttp.ClientSession() as session:
            for target in (direct, gateway):
                await _stream_once(session, target, payload)
            for r in range(rounds):
                for target in (direct, gateway) if r % 2 == 0 else (gateway, direct):
                    results[target.name].append(await _stream_once(session, target, payload))
        return results

    results = asyncio.run(run())
    d, g = results["direct"], results["gateway"]
    return {
        "streams_each": len(d),
        "direct_ttft_p50_ms": statistics.median(x["ttft_ms"] for x in d),
        "gateway_ttft_p50_ms": statistics.median(x["ttft_ms"] for x in g),
        "added_ttft_p50_ms": statistics.median(x["ttft_ms"] for x in g) - statistics.median(x["ttft_ms"] for x in d),
        "direct_chunks": sorted({x["chunks"] for x in d}),
        "gateway_chunks": sorted({x["chunks"] for x in g}),
        "direct_max_gap_ms": max(x["max_gap_ms"] for x in d),
        "gateway_max_gap_ms": max(x["max_gap_ms"] for x in g),
        "usage_before_done": all(x["usage_before_done"] for x in g),
    }


def seed_triton(env: dict[str, str], url: str) -> None:
    """A streaming Triton worker over the decoupled test model `text_stream` (see README, Workers)."""
    manage(env, "registermodel", TRITON_MODEL, "--input-price", "0.1", "--output-price", "0.2")
    worker = {
        "worker_id": "bench-triton-stream",
        "worker_type": "nvidia-gpu",
        "runtime": "triton",
        "runtime_endpoint": url,
        "supported_models": [TRITON_MODEL],
        "runtime_config": {
            "model_name": "text_stream",
            "input_name": "text_input",
            "max_tokens_input_name": "max_tokens",
            "output_name": "text_output",
            "prompt_tokens_output_name": "num_input_tokens",
            "completion_tokens_output_name": "num_output_tokens",
            "streaming": "generate_stream",
        },
    }
    manage(env, "registerworker", "-", stdin=json.dumps(worker))
    manage(env, "probeworkers")


async def _first_text(
    session: aiohttp.ClientSession, url: str, payload: dict[str, Any], headers: dict[str, str]
) -> float:
    """Seconds to the first event with text (Triton's text_output or an OpenAI completions chunk); reads to the end."""
    t0 = time.perf_counter()
    ttft = float("nan")
    async with session.post(url, json=payload, headers=headers) as resp:
        resp.raise_for_status()
        async for raw_line in resp.content:
            line = raw_line.strip()
            if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                continue
            event = json.loads(line[5:])
            if "error" in event:
                raise RuntimeError(f"stream failed: {event['error']}")
            text = event.get("text_output") or (event.get("choices") or [{}])[0].get("text")
            if text and ttft != ttft:
                ttft = time.perf_counter() - t0
    return ttft


def triton_streaming(triton_url: str, gateway: Target, *, rounds: int) -> dict[str, Any]:
    """Added time to first token through SpeedInfer for a streaming Triton worker, against Triton's own
    generate_stream called directly (the same prompt; the model sends its first word at once)."""
    prompt, tokens = "alpha beta gamma delta", 4
    direct_url = f"{triton_url}/v2/models/text_stream/generate_stream"
    direct_body = {"text_input": prompt, "max_tokens": tokens, "stream": True}
    gateway_url = f"http://127.0.0.1:{gateway.port}/v1/completions"
    gateway_body = {"model": TRITON_MODEL, "prompt": prompt, "max_tokens": tokens, "stream": True}
    plain = {"Content-Type": "application/json"}

    async def run() -> dict[str, list[float]]:
        results: dict[str, list[float]] = {"direct": [], "gateway": []}
        async with aiohttp.ClientSession() as session:
            calls = {
                "direct": lambda: _first_text(session, direct_url, direct_body, plain),
                "gateway": lambda: _first_text(session, gateway_url, gateway_body, gateway.headers()),
            }
            for name in calls:  # warm-up
                await calls[name]()
            for r in range(rounds):
                for name in ("direct", "gateway") if r % 2 == 0 else ("gateway", "direct"):
                    results[name].append(await calls[name]())
        return results

    results = asyncio.run(run())
    d, g = statistics.median(results["direct"]) * 1000, statistics.median(results["gateway"]) * 1000
    return {"streams_each": rounds, "direct_ttft_p50_ms": d, "gateway_ttft_p50_ms": g, "added_ttft_p50_ms": g - d}


def fmt_triton_stream(r: dict[str, Any]) -> str:
    return (
        f"ttft direct generate_stream {r['direct_ttft_p50_ms']:.2f} gateway {r['gateway_ttft_p50_ms']:.2f} "
        f"(added {r['added_ttft_p50_ms']:.2f} ms, {r['streams_each']} streams each)"
    )


# ---------------------------------------------------------------------------- orchestration


@dataclass
class Report:
    started: str
    machine: dict[str, Any]
    sections: list[dict[str, Any]] = field(default_factory=list)
    routing: list[dict[str, Any]] = field(default_factory=list)
    peers: list[dict[str, Any]] = field(default_factory=list)  # skipped peers, and why
    soaks: list[dict[str, Any]] = field(default_factory=list)
    tracing: list[dict[str, Any]] = field(default_factory=list)
    held: list[dict[str, Any]] = field(default_factory=list)  # --streams: open streams held by one process


# ---------------------------------------------------------------------------- load held

# A separate process (its own event loop and GIL) asks the gateway for a cheap answer every 100 ms while
# the streams run: its latency over the idle figure is the gateway's event-loop lag, as a client sees it.
PROBE = """
import json, sys, time, http.client
port, key, seconds = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
out, end = [], time.monotonic() + seconds
while time.monotonic() < end:
    t0 = time.perf_counter()
    try:
        conn.request("GET", "/v1/models", headers={"Authorization": "Bearer " + key})
        r = conn.getresponse(); r.read()
        out.append(((time.perf_counter() - t0) * 1000, r.status))
    except Exception:
        out.append(((time.perf_counter() - t0) * 1000, 0))
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    time.sleep(0.1)
print(json.dumps(out))
"""


def _probe(port: int, key: str, seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen(  # noqa: S603
        [PY, "-c", PROBE, str(port), key, str(seconds)], stdout=subprocess.PIPE, text=True
    )


def _probe_result(proc: subprocess.Popen[str]) -> list[float]:
    out, _ = proc.communicate(timeout=300)
    return [ms for ms, status in json.loads(out) if status == 200]


async def _held_streams(gateway: Target, payload: dict[str, Any], n: int, opened: list[int]) -> list[str]:
    """n streams at once; each ends "ok" (200, every chunk, [DONE]) or with what went wrong."""
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=300, sock_read=60)

    async def one(session: aiohttp.ClientSession) -> str:
        try:
            async with session.post(
                f"http://127.0.0.1:{gateway.port}{gateway.path}", json=payload, headers=gateway.headers()
            ) as resp:
                if resp.status != 200:
                    body = await resp.read()
                    code = json.loads(body).get("error", {}).get("code", "") if body.startswith(b"{") else ""
                    return f"{resp.status} {code}".strip()
                first, tail, events = True, b"", 0
                async for chunk in resp.content.iter_any():
                    if first:
                        opened[0] += 1
                        first = False
                    events += chunk.count(b"data:")
                    tail = (tail + chunk)[-64:]
                return "ok" if b"[DONE]" in tail else f"cut after {events} events"
        except (aiohttp.ClientError, TimeoutError) as exc:
            return type(exc).__name__

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        return await asyncio.gather(*(one(session) for _ in range(n)))


def held_streams(gw: Proc, gateway: Target, *, n: int, tokens: int, delay_ms: int) -> dict[str, Any]:
    """n concurrent streams of `tokens` tokens, one every `delay_ms`, on one gateway process: how many
    complete, the gateway's RSS per open stream, and its event-loop lag (a probe's latency) meanwhile."""
    payload = body(directive=f"[sim deltas={tokens} delay={delay_ms}]", stream=True, max_tokens=tokens)
    warm = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=30)
    warm.request("POST", gateway.path, body=json.dumps(body()), headers=gateway.headers())  # the pools open
    warm.getresponse().read()
    idle = _probe(gateway.port, gateway.key, 2)
    idle_ms = _probe_result(idle)
    rss_before = gw.rss_kib()
    seconds = tokens * delay_ms / 1000
    probe = _probe(gateway.port, gateway.key, seconds)
    opened = [0]
    peak = [rss_before]
    stop = False

    async def run() -> list[str]:
        async def sample() -> None:
            while not stop:
                peak[0] = max(peak[0], gw.rss_kib())
                await asyncio.sleep(0.5)

        sampler = asyncio.get_running_loop().create_task(sample())
        try:
            return await _held_streams(gateway, payload, n, opened)
        finally:
            sampler.cancel()

    started = time.perf_counter()
    outcomes = asyncio.run(run())
    stop = True
    wall = time.perf_counter() - started
    busy_ms = _probe_result(probe)
    failures: dict[str, int] = {}
    for outcome in outcomes:
        if outcome != "ok":
            failures[outcome] = failures.get(outcome, 0) + 1
    completed = outcomes.count("ok")
    return {
        "streams": n,
        "tokens": tokens,
        "delay_ms": delay_ms,
        "completed": completed,
        "failed": n - completed,
        "failures": failures,
        "wall_s": wall,
        "rss_before_mib": rss_before / 1024,
        "rss_peak_mib": peak[0] / 1024,
        "rss_per_stream_kib": (peak[0] - rss_before) / opened[0] if opened[0] else float("nan"),
        "idle_probe_p50_ms": statistics.median(idle_ms) if idle_ms else float("nan"),
        "lag_p50_ms": statistics.median(busy_ms) if busy_ms else float("nan"),
        "lag_p99_ms": pct(busy_ms, 99),
        "lag_max_ms": max(busy_ms) if busy_ms else float("nan"),
        "probes": len(busy_ms),
    }


def fmt_held(r: dict[str, Any]) -> str:
    failures = ", ".join(f"{count} {why}" for why, count in sorted(r["failures"].items())) or "none"
    return (
        f"{r['streams']} streams x {r['tokens']} tokens every {r['delay_ms']} ms: {r['completed']} completed, "
        f"{r['failed']} failed ({failures}) in {r['wall_s']:.1f} s | RSS {r['rss_before_mib']:.0f} -> "
        f"{r['rss_peak_mib']:.0f} MiB, {r['rss_per_stream_kib']:.0f} KiB per open stream | probe (loop lag) "
        f"idle p50 {r['idle_probe_p50_ms']:.1f} ms, under load p50 {r['lag_p50_ms']:.1f} p99 {r['lag_p99_ms']:.1f} "
        f"max {r['lag_max_ms']:.1f} ms"
    )


def _warnings(log_path: Path) -> dict[str, int]:
    """The gateway's warnings by kind (request ids and figures dropped): why requests failed."""
    import re

    kinds: dict[str, int] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        if " WARNING " in line or " ERROR " in line:
            kind = re.sub(r"[0-9a-f]{32}|[0-9a-f-]{36}|\d+(\.\d+)?", "#", line.split(" ", 2)[-1])[:160]
            kinds[kind] = kinds.get(kind, 0) + 1
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1])[:5])


def bench_held(profile: str, args: argparse.Namespace, report: Report) -> None:
    """--streams N[,M]: the slow upstream (50 tokens, one every 200 ms) and one gateway process per count."""
    var_dir = Path(tempfile.mkdtemp(prefix=f"speedinfer-bench-held-{profile}-"))
    env = profile_env(profile, var_dir)
    reset_stores(profile)
    up_port = free_port()
    upstream = start(
        "upstream", [PY, "-m", "devtools.simulator", "--port", str(up_port), "--model", MODEL], env, port=up_port
    )
    with running([upstream]):
        key = seed(env, f"http://127.0.0.1:{up_port}/v1")
        for n in args.streams:
            gw_port = free_port()
            gw = start("serve", server_cmd("serve", gw_port, 1), env, port=gw_port, cpus=args.gateway_cpus)
            with running([gw]):
                gateway = Target("gateway", gw_port, "/v1/chat/completions", key)
                row = held_streams(gw, gateway, n=n, tokens=50, delay_ms=200)
                row["profile"] = profile
                row["gateway_warnings"] = _warnings(var_dir / f"serve-{gw_port}.log")
                report.held.append(row)
                print(f"== held {profile}: {fmt_held(row)}", flush=True)
                for kind, count in row["gateway_warnings"].items():
                    print(f"   {count} x {kind}", flush=True)
    shutil.rmtree(var_dir, ignore_errors=True)


# ---------------------------------------------------------------------------- routing


def _served(port: int) -> float:
    """Requests a simulator has answered (its vLLM-style counter)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    line = next(ln for ln in text.splitlines() if ln.startswith("vllm:request_success_total"))
    return float(line.rsplit(" ", 1)[1])


def _closed_loop(target: Target, *, concurrency: int, seconds: float) -> tuple[list[float], int]:
    payload = body()

    async def run() -> tuple[list[float], int]:
        latencies: list[float] = []
        errors = 0
        deadline = time.perf_counter() + seconds
        url = f"http://127.0.0.1:{target.port}{target.path}"
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector, headers=target.headers()) as session:

            async def client() -> None:
                nonlocal errors
                while time.perf_counter() < deadline:
                    t0 = time.perf_counter()
                    async with session.post(url, json=payload) as resp:
                        answer = await resp.read()
                        if resp.status != 200:
                            errors += 1
                            if errors == 1:
                                print(f"   first error: {resp.status} {answer[:200]!r}", flush=True)
                    latencies.append((time.perf_counter() - t0) * 1000)

            await asyncio.gather(*(client() for _ in range(concurrency)))
        return latencies, errors

    return asyncio.run(run())


def bench_routing(profile: str, args: argparse.Namespace, report: Report) -> None:
    """Two simulator workers for one model, one four times slower (and half the batch slots): the share the
    fast one gets and the latency through the gateway, least-loaded (the default) against random choice."""
    var_dir = Path(tempfile.mkdtemp(prefix=f"speedinfer-bench-routing-{profile}-"))
    env = profile_env(profile, var_dir)
    reset_stores(profile)
    ports = {"fast": free_port(), "slow": free_port()}
    shape = {"fast": ("20", "4"), "slow": ("80", "2")}  # latency ms, requests at once
    sims = [
        start(
            name,
            [
                PY,
                "-m",
                "devtools.simulator",
                "--port",
                str(port),
                "--model",
                MODEL,
                "--deltas",
                "16",
                "--latency-ms",
                shape[name][0],
                "--max-concurrency",
                shape[name][1],
            ],
            env,
            port=port,
            cpus=args.upstream_cpus,
        )  # fmt: skip
        for name, port in ports.items()
    ]
    with running(sims):
        key = seed(env, None)
        for name, port in ports.items():
            register(env, name, f"http://127.0.0.1:{port}/v1", metrics_url=f"http://127.0.0.1:{port}/metrics")
        manage(env, "probeworkers")
        for policy in ("least-loaded", "random"):
            gw_port = free_port()
            gw_env = {**env, "SPEEDINFER_ROUTING_POLICY": policy}
            gw = start("serve", server_cmd("serve", gw_port, 1), gw_env, port=gw_port, cpus=args.gateway_cpus)
            with running([gw]):
                gateway = Target("gateway", gw_port, "/v1/chat/completions", key)
                _closed_loop(gateway, concurrency=4, seconds=1)  # warm-up
                row: dict[str, Any] = {"profile": profile, "policy": policy}
                for concurrency in (16, 1):
                    before = {name: _served(port) for name, port in ports.items()}
                    latencies, errors = _closed_loop(
                        gateway, concurrency=concurrency, seconds=args.routing_seconds / (1 if concurrency > 1 else 2)
                    )
                    served = {name: _served(port) - before[name] for name, port in ports.items()}
                    row[f"c{concurrency}"] = {
                        "requests": len(latencies),
                        "errors": errors,
                        "fast_share": served["fast"] / max(1.0, sum(served.values())),
                        "p50_ms": pct(latencies, 50),
                        "p99_ms": pct(latencies, 99),
                    }
                report.routing.append(row)
                print(f"== routing {profile} / {policy}: {fmt_routing(row)}", flush=True)
    shutil.rmtree(var_dir, ignore_errors=True)


def fmt_routing(row: dict[str, Any]) -> str:
    return " | ".join(
        f"c{c}: fast {row[f'c{c}']['fast_share']:.0%}, p50 {row[f'c{c}']['p50_ms']:.1f} p99 "
        f"{row[f'c{c}']['p99_ms']:.1f} ms, {row[f'c{c}']['requests']} requests"
        + (f", ERRORS {row[f'c{c}']['errors']}" if row[f"c{c}"]["errors"] else "")
        for c in (16, 1)
    )


# ---------------------------------------------------------------------------- tracing


class OTLPSink:
    """A collector's OTLP/HTTP endpoint that only counts what it is sent (POST /v1/traces)."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from threading import Thread

        sink = self
        self.posts = 0
        self.bytes = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                sink.posts += 1
                sink.bytes += len(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def bench_tracing(profile: str, args: argparse.Namespace, report: Report) -> None:
    """The same gateway with tracing off and on (every request exported over OTLP/HTTP to a local sink),
    interleaved at c1 (and at c32 with wrk): what a trace adds to a request."""
    var_dir = Path(tempfile.mkdtemp(prefix=f"speedinfer-bench-tracing-{profile}-"))
    env = profile_env(profile, var_dir)
    env = {k: v for k, v in env.items() if not k.startswith("OTEL_")}
    reset_stores(profile)
    upstream, up_port = start_upstream(env, cpus=args.upstream_cpus)
    sink = OTLPSink()
    with running([upstream]):
        key = seed(env, f"http://127.0.0.1:{up_port}/v1")
        ports = {"off": free_port(), "on": free_port()}
        envs = {"off": env, "on": {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url}}
        gws = [
            start(f"serve-tracing-{mode}", server_cmd("serve", port, 1), envs[mode], port=port, cpus=args.gateway_cpus)
            for mode, port in ports.items()
        ]
        with running(gws):
            # latency_c1 names its two paths "direct" and "gateway": here they are tracing off and on.
            off = Target("direct", ports["off"], "/v1/chat/completions", key)
            on = Target("gateway", ports["on"], "/v1/chat/completions", key)
            c1 = latency_c1(off, on, body(), rounds=args.rounds, per_round=args.per_round)
            row: dict[str, Any] = {
                "profile": profile,
                "c1_off_p50_ms": c1["direct_p50_ms"],
                "c1_off_p99_ms": c1["direct_p99_ms"],
                "c1_on_p50_ms": c1["gateway_p50_ms"],
                "c1_on_p99_ms": c1["gateway_p99_ms"],
                "added_p50_ms": c1["added_p50_ms"],
                "added_p99_ms": c1["added_p99_ms"],
                "errors": c1["errors"],
            }
            if shutil.which("wrk"):
                cpu = {"off": gws[0].cpu_s(), "on": gws[1].cpu_s()}
                tp = throughput(off, on, body(), seconds=args.wrk_seconds, rounds=args.wrk_rounds)
                served = {
                    mode: sum(r["requests"] for r in tp["runs"]["direct" if mode == "off" else "gateway"])
                    for mode in ("off", "on")
                }
                row.update(
                    c32_off_rps=tp["direct_rps"],
                    c32_on_rps=tp["gateway_rps"],
                    cpu_ms_per_request_off=(gws[0].cpu_s() - cpu["off"]) * 1000 / max(1, served["off"]),
                    cpu_ms_per_request_on=(gws[1].cpu_s() - cpu["on"]) * 1000 / max(1, served["on"]),
                    errors=row["errors"] + tp["gateway_errors"] + tp["direct_errors"],
                )
            time.sleep(6)  # the batch processor exports every 5 s: let the last batch arrive
            row["otlp_posts"], row["otlp_bytes"] = sink.posts, sink.bytes
    sink.stop()
    report.tracing.append(row)
    print(f"== tracing {profile}: {fmt_tracing(row)}", flush=True)
    shutil.rmtree(var_dir, ignore_errors=True)


def fmt_tracing(row: dict[str, Any]) -> str:
    text = (
        f"c1 off p50/p99 {row['c1_off_p50_ms']:.2f} / {row['c1_off_p99_ms']:.2f} ms, on "
        f"{row['c1_on_p50_ms']:.2f} / {row['c1_on_p99_ms']:.2f} ms, added {row['added_p50_ms']:.2f} / "
        f"{row['added_p99_ms']:.2f} ms"
    )
    if "c32_on_rps" in row:
        text += (
            f"; c32 off {row['c32_off_rps']:.0f} rps ({row['cpu_ms_per_request_off']:.2f} ms CPU/request), on "
            f"{row['c32_on_rps']:.0f} rps ({row['cpu_ms_per_request_on']:.2f} ms CPU/request)"
        )
    text += f"; {row['otlp_posts']} OTLP posts, {row['otlp_bytes'] / 1024:.0f} KiB"
    return text + (f", ERRORS {row['errors']}" if row["errors"] else "")


def start_upstream(env: dict[str, str], *, cpus: str | None = None) -> tuple[Proc, int]:
    """The bundled simulator as the one upstream (OpenAI transport, 16 deltas), and its port."""
    port = free_port()
    cmd = [PY, "-m", "devtools.simulator", "--port", str(port), "--model", MODEL, "--deltas", "16"]
    return start("upstream", cmd, env, port=port, cpus=cpus), port


@contextmanager
def running(procs: list[Proc]) -> Iterator[None]:
    try:
        yield
    finally:
        for proc in reversed(procs):
            proc.stop()


def _stores_sample(profile: str) -> dict[str, int]:
    """What the shared stores hold: Redis keys and memory, PostgreSQL connections to the bench database."""
    if profile != "full":
        return {}
    import psycopg
    import redis

    r = redis.Redis.from_url(REDIS_URL)
    name = PG_URL.rpartition("/")[2]
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (name,)).fetchone()
    return {
        "redis_keys": int(r.dbsize()),
        "redis_set_members": sum(int(r.scard(k)) for k in r.scan_iter("*procs*")),
        "redis_used_memory": int(r.info("memory")["used_memory"]),
        "pg_connections": int(row[0]) if row else 0,
    }


def _restarting(env: dict[str, str], key: str, every: float, stop: threading.Event, tally: dict[str, int]) -> None:
    """A second gateway process on the same stores, stopped (SIGTERM) and started again every `every`
    seconds while serving a light closed loop of its own: each answer it gives must be a 200."""
    payload = json.dumps(body()).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    while not stop.is_set():
        port = free_port()
        proc = start("serve-restarted", server_cmd("serve", port, 1), env, port=port)
        deadline = time.monotonic() + every
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            while time.monotonic() < deadline and not stop.is_set():
                conn.request("POST", "/v1/chat/completions", body=payload, headers=headers)
                response = conn.getresponse()
                response.read()
                tally["answers"] += 1
                tally["non_200"] += response.status != 200
                time.sleep(0.02)
        finally:
            conn.close()
            proc.stop()
        tally["restarts"] += 1


def bench_soak(profile: str, args: argparse.Namespace, report: Report) -> None:
    """`--soak S --restart-every R`: S seconds of c32 on one gateway process, while a second one on the
    same stores is restarted every R seconds; samples every 10 s of the first one's RSS and open files,
    and of what Redis and PostgreSQL hold (nothing may grow with the restarts)."""
    var_dir = Path(tempfile.mkdtemp(prefix=f"speedinfer-soak-{profile}-"))
    env = profile_env(profile, var_dir)
    reset_stores(profile)
    upstream, up_port = start_upstream(env)
    with running([upstream]):
        key = seed(env, f"http://127.0.0.1:{up_port}/v1")
        port = free_port()
        steady = start("serve", server_cmd("serve", port, 1), env, port=port)
        with running([steady]):
            gateway = Target("gateway", port, "/v1/chat/completions", key)
            wrk(gateway, body(), seconds=3)  # warm: pools, caches
            every = f"a second gateway restarted every {args.restart_every:g} s"
            print(f"== soak ({profile}): {args.soak} s at c32, {every}", flush=True)
            stop = threading.Event()
            tally = {"answers": 0, "non_200": 0, "restarts": 0}
            restarter = threading.Thread(target=_restarting, args=(env, key, args.restart_every, stop, tally))
            samples: list[dict[str, Any]] = []
            started = time.monotonic()
            load = subprocess.Popen(  # noqa: S603
                [PY, "-c", "import json,sys; sys.path.insert(0, 'bench'); import run; "
                 f"print(json.dumps(run.wrk(run.Target('gateway', {port}, '/v1/chat/completions', {key!r}), "
                 f"run.body(), seconds={args.soak})))"],
                cwd=ROOT, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            restarter.start()
            while load.poll() is None:
                sample = {"t_s": round(time.monotonic() - started), "rss_mib": steady.rss_kib() / 1024,
                          "open_files": steady.open_files(), **_stores_sample(profile)}  # fmt: skip
                samples.append(sample)
                print(f"   {sample}", flush=True)
                for _ in range(100):
                    if load.poll() is not None:
                        break
                    time.sleep(0.1)
            stop.set()
            restarter.join()
            result = json.loads(load.communicate()[0].strip().splitlines()[-1])
            time.sleep(1)  # the last restarted process's withdrawal
            samples.append({"t_s": round(time.monotonic() - started), "rss_mib": steady.rss_kib() / 1024,
                            "open_files": steady.open_files(), **_stores_sample(profile)})  # fmt: skip
    row = {"profile": profile, "seconds": args.soak, "requests": result["requests"], "errors": result["errors"],
           "rps": result["rps"], "restart_every_s": args.restart_every, **tally, "samples": samples}  # fmt: skip
    report.soaks.append(row)
    print(f"   {fmt_soak(row)}", flush=True)
    shutil.rmtree(var_dir, ignore_errors=True)


def fmt_soak(row: dict[str, Any]) -> str:
    first, steady, last = row["samples"][0], row["samples"][1:-1] or row["samples"], row["samples"][-1]

    def span(name: str, scale: float = 1.0, unit: str = "") -> str:
        values = [s[name] * scale for s in steady if name in s]
        if not values:
            return ""
        return f"{name} {first[name] * scale:.1f} -> {last[name] * scale:.1f}{unit} (max {max(values):.1f})"

    parts = [span("rss_mib", unit=" MiB"), span("open_files"), span("redis_keys"), span("redis_set_members"),
             span("redis_used_memory", 1 / 1024, " KiB"), span("pg_connections")]  # fmt: skip
    return (
        f"{row['seconds']} s at c32: {row['requests']} requests ({row['rps']:.0f}/s), {row['errors']} errors; "
        f"restarted gateway: {row['restarts']} restarts, {row['answers']} answers, {row['non_200']} not 200; "
        + "; ".join(p for p in parts if p)
    )


def c1_rows(direct: Target, target: Target, args: argparse.Namespace) -> dict[str, Any]:
    """One request at a time against `target` and the direct path, at each upstream latency."""
    rows: dict[str, Any] = {}
    for latency in args.latencies:
        directive = f"[sim latency={latency}]" if latency else ""
        rows[f"c1_{latency}ms"] = latency_c1(
            direct, target, body(directive=directive), rounds=args.rounds, per_round=args.per_round
        )
        print(f"   c1 upstream {latency} ms: {fmt_c1(rows[f'c1_{latency}ms'])}", flush=True)
    return rows


def c32_row(proc: Proc, direct: Target, target: Target, args: argparse.Namespace) -> dict[str, Any]:
    """wrk at c32 against `target` (served by `proc`) and the direct path, with proc's CPU per request."""
    cpu_before = proc.cpu_s()
    row = throughput(direct, target, body(), seconds=args.wrk_seconds, rounds=args.wrk_rounds)
    served = sum(r["requests"] for r in row["runs"]["gateway"])
    row["cpu_ms_per_request"] = (proc.cpu_s() - cpu_before) * 1000 / max(1, served)
    return row


def bench_profile(profile: str, args: argparse.Namespace, report: Report) -> None:
    var_dir = Path(tempfile.mkdtemp(prefix=f"speedinfer-bench-{profile}-"))
    env = profile_env(profile, var_dir)
    reset_stores(profile)
    triton = start_triton()
    upstream, up_port = start_upstream(env, cpus=args.upstream_cpus)
    try:
        _bench_servers(profile, args, report, env, up_port, upstream, triton)
    finally:
        if triton is not None:
            triton.stop()
    shutil.rmtree(var_dir, ignore_errors=True)


def _bench_servers(
    profile: str,
    args: argparse.Namespace,
    report: Report,
    env: dict[str, str],
    up_port: int,
    upstream: Proc,
    triton: Any,
) -> None:
    with running([upstream]):
        key = seed(env, f"http://127.0.0.1:{up_port}/v1")
        if triton is not None:
            seed_triton(env, triton.url)
        direct = Target("direct", up_port, "/v1/chat/completions")
        # --accounts N: a second c32 row with each request from the next of N accounts (one key each).
        spread = seed_accounts(env, args.accounts) if args.accounts > 1 else []
        for server in args.servers:
            for workers in args.workers:
                if server == "daphne" and workers != 1:
                    continue
                gw_port = free_port()
                gw = start(server, server_cmd(server, gw_port, workers), env, port=gw_port, cpus=args.gateway_cpus)
                with running([gw]):
                    gateway = Target("gateway", gw_port, "/v1/chat/completions", key)
                    label = f"{profile} / {server} x{workers}"
                    print(f"== {label}", flush=True)
                    section: dict[str, Any] = {"profile": profile, "server": server, "workers": workers}
                    section.update(c1_rows(direct, gateway, args))
                    section["c32_0ms"] = c32_row(gw, direct, gateway, args)
                    print(f"   c32: {fmt_tp(section['c32_0ms'])}", flush=True)
                    if spread:
                        many = Target("gateway", gw_port, "/v1/chat/completions", ",".join(spread))
                        section["c32_accounts"] = {**c32_row(gw, direct, many, args), "accounts": len(spread)}
                        print(f"   c32 over {len(spread)} accounts: {fmt_tp(section['c32_accounts'])}", flush=True)
                    if server == args.servers[0] and workers == args.workers[0]:
                        section["stream"] = streaming(
                            direct, gateway, deltas=64, delay_ms=20, rounds=args.stream_rounds
                        )
                        print(f"   stream: {fmt_stream(section['stream'])}", flush=True)
                        # The targets' added time to first token: an upstream that answers at once.
                        section["stream_0ms"] = streaming(
                            direct, gateway, deltas=16, delay_ms=0, rounds=args.stream_rounds * 3
                        )
                        print(f"   stream, 0 ms upstream: {fmt_stream(section['stream_0ms'])}", flush=True)
                        if triton is not None:
                            section["triton_stream"] = triton_streaming(triton.url, gateway, rounds=args.stream_rounds)
                            print(f"   triton stream: {fmt_triton_stream(section['triton_stream'])}", flush=True)
                        rss_before = gw.rss_kib()
                        soak = wrk(gateway, body(), seconds=args.soak)
                        rss_after = gw.rss_kib()
                        section["soak"] = {
                            "seconds": args.soak,
                            "requests": soak["requests"],
                            "errors": soak["errors"],
                            "rss_before_mib": rss_before / 1024,
                            "rss_after_mib": rss_after / 1024,
                        }
                        print(
                            f"   soak {args.soak}s: {soak['requests']} requests, {soak['errors']} errors, RSS "
                            f"{rss_before / 1024:.1f} -> {rss_after / 1024:.1f} MiB",
                            flush=True,
                        )
                    report.sections.append(section)
        if args.peers and not report.peers and not any(s["profile"] == "peer" for s in report.sections):
            bench_peers(args, report, env, direct, up_port)  # once per run, on the first profile's upstream


PORTKEY_VERSION = "1.15.2"
PORTKEY_DIR = Path(os.environ.get("BENCH_PORTKEY_DIR", str(Path.home() / ".cache" / "speedinfer" / "portkey")))
LITELLM_VERSION = "1.108.0"  # 1.108.1+ pin a litellm-proxy-extras that PyPI does not have
LITELLM_DIR = Path(os.environ.get("BENCH_LITELLM_DIR", str(Path.home() / ".cache" / "speedinfer" / "litellm")))


def portkey_script() -> Path | str:
    """Portkey's gateway (npm `@portkey-ai/gateway`, installed once into PORTKEY_DIR), or why it is skipped."""
    script = PORTKEY_DIR / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js"
    if not shutil.which("node"):
        return "node is not installed"
    if script.exists():
        return script
    if not shutil.which("npm"):
        return "npm is not installed"
    print(f"   installing @portkey-ai/gateway@{PORTKEY_VERSION} into {PORTKEY_DIR}", flush=True)
    try:
        done = subprocess.run(  # noqa: S603
            ["npm", "install", "--prefix", str(PORTKEY_DIR), "--no-audit", "--no-fund", "--loglevel", "error",
             f"@portkey-ai/gateway@{PORTKEY_VERSION}"],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return "npm install timed out"
    if done.returncode != 0 or not script.exists():
        return f"npm install failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
    return script


def stream_check(target: Target) -> str:
    """One stream through a peer: "ok", or how it fails (Portkey's streaming fails on Node.js 20)."""

    async def run() -> dict[str, Any]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            return await _stream_once(session, target, body(stream=True))

    try:
        result = asyncio.run(run())
    except aiohttp.ClientResponseError as exc:
        return f"FAILS: HTTP {exc.status}"
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        return f"FAILS: {type(exc).__name__}"
    return "ok" if result["chunks"] > 0 else "FAILS: no content deltas"


def litellm_python() -> Path | str:
    """LiteLLM's proxy (PyPI `litellm[proxy]`, installed once into a venv of its own under LITELLM_DIR:
    its pins must not touch SpeedInfer's), or why it is skipped."""
    python = LITELLM_DIR / "bin" / "python"
    marker = LITELLM_DIR / f".installed-{LITELLM_VERSION}"
    if marker.exists():
        return python
    print(f"   installing litellm[proxy]=={LITELLM_VERSION} into {LITELLM_DIR}", flush=True)
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(LITELLM_DIR)], check=True, capture_output=True)  # noqa: S603
        done = subprocess.run(  # noqa: S603
            [str(python), "-m", "pip", "install", "-q", f"litellm[proxy]=={LITELLM_VERSION}"],
            capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
    except (subprocess.TimeoutExpired, subprocess.CalledProcessError) as exc:
        return f"installing litellm failed: {type(exc).__name__}"
    if done.returncode != 0:
        return f"pip install failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
    marker.touch()
    return python


def _litellm_peer(env: dict[str, str], up_port: int) -> tuple[list[str], dict[str, str], str] | str:
    python = litellm_python()
    if isinstance(python, str):
        return python
    config = LITELLM_DIR / "bench-config.yaml"
    # Bare: no database, no master key, no callbacks; one model routed to the bench's upstream.
    config.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: http://127.0.0.1:{up_port}/v1\n"
        "      api_key: sk-bench-unused\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
    )
    version = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    cmd = [str(LITELLM_DIR / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1", "--port", "{port}"]
    # Bare, on loopback only: LiteLLM 1.108 refuses to start without a master key unless told this is local.
    peer_env = {
        **env,
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
        "DISABLE_SCHEMA_UPDATE": "True",
        "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
    }
    peer_env.pop("DATABASE_URL", None)
    return cmd, peer_env, f"litellm {version}"


def _portkey_peer(env: dict[str, str], up_port: int) -> tuple[list[str], dict[str, str], str] | str:
    script = portkey_script()
    if isinstance(script, str):
        return script
    node = subprocess.run(["node", "--version"], capture_output=True, text=True, check=False).stdout.strip()
    return ["node", str(script), "--port={port}", "--headless"], env, f"portkey {PORTKEY_VERSION} (node {node})"


def bench_peers(args: argparse.Namespace, report: Report, env: dict[str, str], direct: Target, up_port: int) -> None:
    """The peers on the same upstream, in the same run: Portkey's open-source gateway (a pure
    pass-through: no keys, limits or ledger) and LiteLLM's proxy (bare: no database or master key)."""
    portkey_headers = {"x-portkey-provider": "openai", "x-portkey-custom-host": f"http://127.0.0.1:{up_port}/v1"}
    for name, make, extra in (
        ("portkey", _portkey_peer, portkey_headers),
        ("litellm", _litellm_peer, {}),
    ):
        if name not in args.peers:
            continue
        made = make(env, up_port)
        if isinstance(made, str):
            print(f"== peer {name}: skipped ({made})", flush=True)
            report.peers.append({"name": name, "skipped": made})
            continue
        cmd, peer_env, label = made
        port = free_port()
        try:
            peer = start(name, [part.format(port=port) for part in cmd], peer_env, port=port, cpus=args.gateway_cpus)
        except RuntimeError as exc:  # a peer that does not start is reported, not a failed bench
            why = f"did not start: {str(exc).strip().splitlines()[-1][:200]}"
            print(f"== peer {name}: skipped ({why})", flush=True)
            report.peers.append({"name": name, "skipped": why})
            continue
        with running([peer]):
            # The upstream ignores the key; both peers forward it to their openai provider.
            target = Target("gateway", port, "/v1/chat/completions", key="sk-bench-unused", extra=extra)
            print(f"== peer {label}", flush=True)
            section: dict[str, Any] = {"profile": "peer", "server": label.split(" (")[0], "workers": 1}
            section.update(c1_rows(direct, target, args))
            section["c32_0ms"] = c32_row(peer, direct, target, args)
            print(f"   c32: {fmt_tp(section['c32_0ms'])}", flush=True)
            checked = stream_check(target)
            section["stream_check"] = checked
            if checked != "ok" and name == "portkey":
                section["stream_check"] += f" on {label}: Portkey's streaming fails on Node.js 20, no streaming figures"
            print(f"   stream: {section['stream_check']}", flush=True)
            report.sections.append(section)


def start_triton() -> Any:
    """The real Triton server over tests/triton_models where `make triton` installed it, else None."""
    sys.path.insert(0, str(ROOT))
    from devtools.tritonserver import TritonServer, triton_installed

    if not triton_installed():
        print("   (no Triton streaming scenario: `make triton` has not installed the server)", flush=True)
        return None
    return TritonServer().start()


def fmt_c1(r: dict[str, Any]) -> str:
    return (
        f"direct p50 {r['direct_p50_ms']:.2f} p99 {r['direct_p99_ms']:.2f} | gateway p50 {r['gateway_p50_ms']:.2f} "
        f"p99 {r['gateway_p99_ms']:.2f} | added p50 {r['added_p50_ms']:.2f} p99 {r['added_p99_ms']:.2f} ms"
        f"{' | ERRORS ' + str(r['errors']) if r['errors'] else ''}"
    )


def fmt_tp(r: dict[str, Any]) -> str:
    cpu = f" | gateway CPU {r['cpu_ms_per_request']:.2f} ms/request" if "cpu_ms_per_request" in r else ""
    return (
        f"direct {r['direct_rps']:.0f} rps p99 {r['direct_p99_ms']:.1f} | gateway {r['gateway_rps']:.0f} rps "
        f"p99 {r['gateway_p99_ms']:.1f} ms | gateway errors {r['gateway_errors']}{cpu}"
    )


def fmt_stream(r: dict[str, Any]) -> str:
    return (
        f"ttft direct {r['direct_ttft_p50_ms']:.2f} gateway {r['gateway_ttft_p50_ms']:.2f} (added "
        f"{r['added_ttft_p50_ms']:.2f} ms) | chunks {r['direct_chunks']} vs {r['gateway_chunks']} | max gap "
        f"{r['direct_max_gap_ms']:.1f} vs {r['gateway_max_gap_ms']:.1f} ms | usage before [DONE]: "
        f"{r['usage_before_done']}"
    )


def table(report: Report) -> str:
    lines = [
        f"# SpeedInfer benchmark, {report.started}",
        "",
        f"Machine: {report.machine}",
        "",
        "| profile | server | c1 direct p50/p99 | c1 gateway p50/p99 | added p50/p99 | c1@20ms added p50/p99 "
        "| c32 direct rps | c32 gateway rps (p99) | errors |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    if not report.sections:
        lines = lines[:4]
    for s in report.sections:
        c0 = s.get("c1_0ms", {})
        c20 = s.get("c1_20ms", {})
        tp = s["c32_0ms"]
        lines.append(
            f"| {s['profile']} | {s['server']} x{s['workers']} "
            f"| {c0.get('direct_p50_ms', 0):.2f} / {c0.get('direct_p99_ms', 0):.2f} ms "
            f"| {c0.get('gateway_p50_ms', 0):.2f} / {c0.get('gateway_p99_ms', 0):.2f} ms "
            f"| {c0.get('added_p50_ms', 0):.2f} / {c0.get('added_p99_ms', 0):.2f} ms "
            f"| {c20.get('added_p50_ms', float('nan')):.2f} / {c20.get('added_p99_ms', float('nan')):.2f} ms "
            f"| {tp['direct_rps']:.0f} | {tp['gateway_rps']:.0f} ({tp['gateway_p99_ms']:.1f} ms) "
            f"| {tp['gateway_errors'] + c0.get('errors', 0)} |"
        )
    if report.routing:
        lines += [
            "",
            "Routing: fast worker 20 ms x4 slots, slow 80 ms x2 slots, one model",
            "",
            "| profile | policy | c16 fast share | c16 p50 / p99 | c1 fast share | c1 p50 / p99 |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for r in report.routing:
            a, b = r["c16"], r["c1"]
            lines.append(
                f"| {r['profile']} | {r['policy']} | {a['fast_share']:.0%} | {a['p50_ms']:.1f} / {a['p99_ms']:.1f} ms "
                f"| {b['fast_share']:.0%} | {b['p50_ms']:.1f} / {b['p99_ms']:.1f} ms |"
            )
    for s in report.sections:
        if "stream_check" in s:
            lines += ["", f"Streaming ({s['server']}): {s['stream_check']}"]
    for p in report.peers:
        lines += ["", f"Peer {p['name']}: skipped ({p['skipped']})"]
    for t in report.tracing:
        lines += ["", f"Tracing ({t['profile']}, serve x1, OTLP/HTTP to a local receiver): {fmt_tracing(t)}"]
    for s in report.sections:
        if "c32_accounts" in s:
            lines += ["", f"c32 over {s['c32_accounts']['accounts']} accounts ({s['profile']}, {s['server']} "
                      f"x{s['workers']}): {fmt_tp(s['c32_accounts'])}"]  # fmt: skip
    for k in report.soaks:
        lines += ["", f"Soak with restarts ({k['profile']}, serve x1): {fmt_soak(k)}"]
    for h in report.held:
        lines += ["", f"Held ({h['profile']}, serve x1): {fmt_held(h)}"]
    for s in report.sections:
        if "stream" in s:
            lines += ["", f"Streaming ({s['profile']}, {s['server']}): {fmt_stream(s['stream'])}"]
        if "stream_0ms" in s:
            lines.append(f"Streaming, 0 ms upstream ({s['profile']}, {s['server']}): {fmt_stream(s['stream_0ms'])}")
        if "triton_stream" in s:
            lines.append(f"Triton streaming ({s['profile']}, {s['server']}): {fmt_triton_stream(s['triton_stream'])}")
        if "soak" in s:
            k = s["soak"]
            lines.append(
                f"Soak ({s['profile']}, {s['server']}): {k['seconds']} s at c32, {k['requests']} requests, "
                f"{k['errors']} errors, gateway RSS {k['rss_before_mib']:.1f} -> {k['rss_after_mib']:.1f} MiB"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", default="full,embedded", help="comma-separated: full, embedded")
    parser.add_argument(
        "--servers", default="serve", help="comma-separated: serve (manage.py serve), uvicorn, granian, daphne"
    )
    parser.add_argument("--no-peers", action="store_true", help="skip the peers (Portkey's gateway, LiteLLM's proxy)")
    parser.add_argument(
        "--peers", default="portkey,litellm", help="comma-separated peers to run beside SpeedInfer: portkey, litellm"
    )
    parser.add_argument(
        "--accounts",
        type=int,
        default=16,
        help="a second c32 row spread over this many accounts (one account serialises its reserve and settle)",
    )
    parser.add_argument("--workers", default="1", help="comma-separated gateway process counts, e.g. 1,2")
    parser.add_argument("--latencies", default="0,20", help="upstream latencies in ms for the c1 runs")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=100)
    parser.add_argument("--wrk-seconds", type=int, default=8)
    parser.add_argument("--wrk-rounds", type=int, default=2)
    parser.add_argument("--stream-rounds", type=int, default=10)
    parser.add_argument("--soak", type=int, default=30, help="seconds of sustained c32 load for the memory check")
    parser.add_argument(
        "--restart-every",
        type=float,
        default=0,
        help="only the soak: --soak seconds of c32 on one gateway while a second is restarted every this many seconds",
    )
    parser.add_argument("--gateway-cpus", default=None, help="taskset list for the gateway, e.g. 0")
    parser.add_argument("--upstream-cpus", default=None, help="taskset list for the upstream, e.g. 1")
    parser.add_argument("--quick", action="store_true", help="a short smoke run (for CI)")
    parser.add_argument(
        "--routing", action="store_true", help="only the routing scenario: fast/slow split and p99 by policy"
    )
    parser.add_argument("--routing-seconds", type=float, default=10, help="seconds of c16 per policy (c1: half)")
    parser.add_argument(
        "--tracing", action="store_true", help="only the tracing scenario: the gateway with OTLP export off and on"
    )
    parser.add_argument(
        "--scheduling",
        action="store_true",
        help="only the scheduling scenario: multi-tenant workloads through each policy (bench/scheduling.py)",
    )
    parser.add_argument(
        "--streams",
        default="",
        help="only the load-held scenario: comma-separated counts of concurrent slow streams, e.g. 500,2000",
    )
    args = parser.parse_args(argv)
    if args.scheduling:
        from scheduling import bench_scheduling

        text = bench_scheduling(args)
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "scheduling.md").write_text(text + "\n")
        print()
        print(text)
        return
    args.streams = [int(n) for n in args.streams.split(",") if n.strip()]
    args.peers = [] if args.no_peers else [p.strip() for p in args.peers.split(",") if p.strip()]
    args.servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    args.workers = [int(w) for w in args.workers.split(",")]
    args.latencies = [int(x) for x in args.latencies.split(",")]
    if args.quick:
        args.rounds, args.per_round, args.wrk_seconds, args.wrk_rounds = 2, 20, 2, 1
        args.stream_rounds, args.soak, args.routing_seconds = 2, 2, 2
    only = args.routing or args.tracing or bool(args.streams) or args.restart_every > 0
    if not shutil.which("wrk") and not (args.routing or args.tracing or args.streams):
        sys.exit("wrk is not installed: `make bench` installs it (apt-get install wrk)")
    report = Report(
        started=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        machine={"cpus": os.cpu_count(), "python": sys.version.split()[0]},
    )
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]
    if args.streams:
        for profile in profiles:
            bench_held(profile, args, report)
    if args.restart_every > 0:
        for profile in profiles:
            bench_soak(profile, args, report)
    if not only:
        for profile in profiles:
            bench_profile(profile, args, report)
    if args.routing or not only:
        bench_routing(profiles[0], args, report)
    if args.tracing or not only:
        bench_tracing(profiles[0], args, report)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    (RESULTS / f"bench-{stamp}.json").write_text(json.dumps(report.__dict__, indent=2, default=str))
    text = table(report)
    (RESULTS / "latest.md").write_text(text)
    print()
    print(text)


if __name__ == "__main__":
    main()
