"""The worker agent: a GPU host registers its own worker through the staff API, every interval.

`manage.py workeragent` runs this on the GPU host. It reads the worker's registration JSON, fills
`gpu_metadata` from NVML (workers.gpu; never a serial number or UUID), checks the local runtime's
readiness, and POSTs the document to `/api/workers/` (create or update) with an `admin`-scope key. It
touches no database and no Redis: everything goes through the API.

Each report carries `runtime_metadata.agent` = {"reported_at", "interval", "version", "runtime_ready",
"gpu"}; `agent_report_state` reads it back on the server so the API and the admin can show a worker
whose agent stopped reporting (no report for STALE_AFTER_INTERVALS intervals).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from workers.gpu import GpuReading, gpu_read

AGENT_VERSION = "1"
DEFAULT_INTERVAL = 30.0
STALE_AFTER_INTERVALS = 3
_TIMEOUT = httpx.Timeout(10.0, connect=5.0)
# Runtimes whose transport is Triton's HTTP v2 (workers.registration decides the same way).
_TRITON = "triton"


class AgentError(Exception):
    """A one-line reason the report failed; the message never holds the key."""


class KeyRefused(AgentError):
    """The SpeedInfer refused the key (401/403): retrying will not help."""


class RegistrationRefused(AgentError):
    """The SpeedInfer refused the document (400): the file needs fixing."""


@dataclass(frozen=True)
class Report:
    worker_id: str
    created: bool
    gpu: GpuReading
    runtime_ready: bool
    runtime_check: str


def registration_load(path: str) -> dict[str, Any]:
    """The registration JSON from FILE; AgentError names what is wrong with it."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise AgentError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AgentError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(data, dict):
        raise AgentError(f"{path}: must hold one worker's registration (a JSON object)")
    for name in ("worker_id", "runtime", "runtime_endpoint"):
        if not isinstance(data.get(name), str) or not data[name].strip():
            raise AgentError(f"{path}: {name} is required")
    for name in ("runtime_config", "runtime_metadata"):
        if not isinstance(data.get(name, {}), dict):
            raise AgentError(f"{path}: {name} must be a JSON object")
    return data


def _uses_triton(doc: dict[str, Any]) -> bool:
    config = doc.get("runtime_config") or {}
    return doc.get("runtime") == _TRITON or config.get("transport") == _TRITON


def runtime_readiness(*, doc: dict[str, Any], client: httpx.Client) -> tuple[bool, str]:
    """Ask the local runtime whether it is ready: Triton's /v2/health/ready, or an OpenAI-style /models.

    The detail is a status or an error class only: never the endpoint or the worker's key."""
    endpoint = str(doc["runtime_endpoint"]).rstrip("/")
    headers = {}
    if _uses_triton(doc):
        url = f"{endpoint}/v2/health/ready"
    else:
        url = f"{endpoint}/models"
        if doc.get("upstream_api_key"):
            headers["Authorization"] = f"Bearer {doc['upstream_api_key']}"
    try:
        response = client.get(url, headers=headers, timeout=5.0)
    except httpx.HTTPError as exc:
        return False, f"unreachable ({type(exc).__name__})"
    return response.status_code == 200, f"HTTP {response.status_code}"


def report_build(
    *, doc: dict[str, Any], gpu: GpuReading, runtime_ready: bool, runtime_check: str, interval: float, now: datetime
) -> dict[str, Any]:
    """The document to POST: the file's registration, GPU metadata from NVML only, the agent's own status.

    gpu_metadata is replaced, not merged: what the host's driver says wins over what an operator typed,
    and without a GPU the worker carries none."""
    body = {key: value for key, value in doc.items() if key != "gpu_metadata"}
    body["gpu_metadata"] = dict(gpu.metadata)
    body["runtime_metadata"] = {
        **(doc.get("runtime_metadata") or {}),
        "agent": {
            "reported_at": now.astimezone(UTC).isoformat(timespec="seconds"),
            "interval": interval,
            "version": AGENT_VERSION,
            "runtime_ready": runtime_ready,
            "runtime_check": runtime_check,
            "gpu": "nvml" if gpu.metadata else "none",
        },
    }
    return body


def _error_message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error") or {}
    except (ValueError, AttributeError):
        return f"HTTP {response.status_code}"
    message = str(error.get("message") or f"HTTP {response.status_code}")
    return message.splitlines()[0][:300]


def report_send(*, client: httpx.Client, api: str, key: str, body: dict[str, Any]) -> bool:
    """POST the registration to the staff API; True when the worker was created, False when updated."""
    url = f"{api.rstrip('/')}/api/workers/"
    try:
        response = client.post(url, json=body, headers={"Authorization": f"Bearer {key}"})
    except httpx.HTTPError as exc:
        raise AgentError(f"cannot reach the SpeedInfer at {api}: {type(exc).__name__}") from None
    if response.status_code in (401, 403):
        raise KeyRefused(
            f"the SpeedInfer at {api} refused the key (HTTP {response.status_code}): {_error_message(response)}; "
            "the agent needs an admin-scope key (manage.py createapikey ACCOUNT --scopes admin)"
        )
    if response.status_code == 400:
        raise RegistrationRefused(f"the SpeedInfer refused the registration: {_error_message(response)}")
    if response.status_code not in (200, 201):
        raise AgentError(f"the SpeedInfer at {api} answered HTTP {response.status_code}: {_error_message(response)}")
    return response.status_code == 201


class WorkerAgent:
    """Reports one worker every interval; `out` and `err` take one line each (the command's stdout/stderr).

    Errors alone go to `err`, so a failing command's stderr is its one-line reason."""

    def __init__(
        self,
        *,
        api: str,
        key: str,
        doc: dict[str, Any],
        interval: float = DEFAULT_INTERVAL,
        out: Callable[[str], None] = print,
        err: Callable[[str], None] = print,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.api = api.rstrip("/")
        self.key = key
        self.doc = doc
        self.interval = interval
        self.out = out
        self.err = err
        self.clock = clock
        self.stop = threading.Event()
        self._last_gpu_reason: str | None = None

    def report_once(self, client: httpx.Client) -> Report:
        gpu = gpu_read()
        if gpu.reason != self._last_gpu_reason:
            # Said once, and again only when it changes: a loop every 30 s must not flood the journal.
            if gpu.reason:
                self.out(f"no GPU metadata: {gpu.reason}; registering {self.doc['worker_id']} without it")
            self._last_gpu_reason = gpu.reason
        ready, check = runtime_readiness(doc=self.doc, client=client)
        body = report_build(
            doc=self.doc, gpu=gpu, runtime_ready=ready, runtime_check=check, interval=self.interval, now=self.clock()
        )
        created = report_send(client=client, api=self.api, key=self.key, body=body)
        return Report(
            worker_id=str(self.doc["worker_id"]), created=created, gpu=gpu, runtime_ready=ready, runtime_check=check
        )

    def describe(self, report: Report) -> str:
        verb = "created" if report.created else "updated"
        runtime = "ready" if report.runtime_ready else f"not ready ({report.runtime_check})"
        gpu = report.gpu.metadata
        gpus = f"{gpu['count']} x {gpu['product']}" if gpu else "no GPU metadata"
        return f"{verb} worker {report.worker_id} at {self.api}: runtime {runtime}, {gpus}"

    def run(self, *, once: bool = False) -> None:
        """Report now and every interval. A refused key or document ends the loop (AgentError); a network
        error or a SpeedInfer answering 5xx is one line and a retry next interval (with `once`: raised)."""
        with httpx.Client(timeout=_TIMEOUT) as client:
            while True:
                started = time.monotonic()
                try:
                    self.out(self.describe(self.report_once(client)))
                except (KeyRefused, RegistrationRefused):
                    raise
                except AgentError as exc:
                    if once:
                        raise
                    self.err(f"report failed, retrying in {self.interval:g} s: {exc}")
                if once:
                    return
                if self.stop.wait(max(0.0, self.interval - (time.monotonic() - started))):
                    return


@dataclass(frozen=True)
class AgentState:
    reported_at: datetime
    age_s: int
    interval: float
    stale: bool
    runtime_ready: bool | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "reported_at": self.reported_at.isoformat(),
            "age_s": self.age_s,
            "interval": self.interval,
            "stale": self.stale,
            "runtime_ready": self.runtime_ready,
        }

    def describe(self) -> str:
        age = f"{self.age_s} s" if self.age_s < 120 else f"{self.age_s // 60} min"
        return f"{'stale: ' if self.stale else ''}last report {age} ago"


def agent_report_state(*, runtime_metadata: Any, now: datetime) -> AgentState | None:
    """What the worker's agent last said (server side), or None for a worker without an agent.

    `reported_at` is the GPU host's clock: hosts are expected to run NTP, and the three-interval margin
    absorbs ordinary skew."""
    agent = runtime_metadata.get("agent") if isinstance(runtime_metadata, dict) else None
    if not isinstance(agent, dict):
        return None
    try:
        reported_at = datetime.fromisoformat(str(agent["reported_at"]))
        interval = float(agent.get("interval") or DEFAULT_INTERVAL)
    except (KeyError, TypeError, ValueError):
        return None
    if reported_at.tzinfo is None:
        reported_at = reported_at.replace(tzinfo=UTC)
    age = max(0, int((now - reported_at).total_seconds()))
    ready = agent.get("runtime_ready")
    return AgentState(
        reported_at=reported_at,
        age_s=age,
        interval=interval,
        stale=age > STALE_AFTER_INTERVALS * interval,
        runtime_ready=ready if isinstance(ready, bool) else None,
    )
