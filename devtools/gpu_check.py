"""`make gpu-check`: SpeedInfer in front of a real Triton on a real NVIDIA GPU, end to end, in one script.

On a machine with an NVIDIA GPU it
 1. checks its prerequisites (NVML sees a GPU, a Python whose libpython the Triton backend stub can link,
    torch for the model, the openai SDK and uvicorn for SpeedInfer);
 2. makes a Triton venv (nvidia-pytriton 0.7.0, numpy 1.26.4 forced: numpy 2 breaks the stub's BYTES tensors;
    the host Python's packages seen through a .pth so its torch is used; `--wheels DIR` installs offline);
 3. writes a model repository: a tiny seeded torch language model (embedding, MLP, greedy argmax over a word
    vocabulary) in a Python-backend model on the GPU, once plain (`/infer`) and once decoupled
    (`/generate_stream`); no model hub download;
 4. starts the real tritonserver over it;
 5. starts SpeedInfer beside it (uvicorn speedinfer.asgi:application, embedded SQLite in a temporary folder,
    seeded with manage.py commands: two models, an account with credits, a chat key and an admin key);
 6. runs `manage.py workeragent --once` for both workers with an unreachable DATABASE_URL (the agent needs
    none) and prints the GPU metadata SpeedInfer stored;
 7. probes, sends chat requests with the openai SDK through the gateway (streamed and not) and the same
    requests straight to Triton, and prints the usage settled and the added latency and time to first token;
 8. prefix affinity (docs/scheduler.md): registers the runtime twice more for a third model (two worker ids,
    one runtime), sends three tenants' requests with long distinct system prompts and one tenant's with a
    `prompt_cache_key`, and prints which worker served each tenant (from the gateway's /metrics): each
    tenant's requests stay on one worker.

`--dry-run` (no GPU needed): checks the prerequisites, prints the plan, and runs steps 5, 6 and 8 (the agent
registers the Triton worker without GPU metadata against a started SpeedInfer; step 8 against two
simulators with the GPU model, devtools/simulator.py, instead of Triton); exits 0 when those work.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
PYTRITON = "nvidia-pytriton==0.7.0"
NUMPY_FOR_STUB = "numpy==1.26.4"
MODEL_PLAIN = "gpucheck/tiny-lm"
MODEL_STREAM = "gpucheck/tiny-lm-stream"
MODEL_AFFINITY = "gpucheck/affinity"
TENSORS = {
    "input_name": "text_input",
    "max_tokens_input_name": "max_tokens",
    "output_name": "text_output",
    "prompt_tokens_output_name": "prompt_tokens",
    "completion_tokens_output_name": "completion_tokens",
}
# What the agent's process gets instead of a database and Redis: a query would fail it.
UNREACHABLE = {"DATABASE_URL": "postgres://nobody@127.0.0.1:1/unreachable", "REDIS_URL": "redis://127.0.0.1:1/0"}
UUID_VALUE = re.compile(r"(?i)\b(gpu-|mig-)?[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
PROMPT = "Tell me how the GPU in this worker answers a request"

MODEL_PY = '''\
"""gpu_check's tiny language model: seeded random weights, greedy argmax over a word vocabulary.

Plain: one response per request. Decoupled (config): one response per generated word, each carrying the
prompt and completion counts so far, the last one the totals (SpeedInfer settles from the last that has them).
"""
import json

import numpy as np
import triton_python_backend_utils as pb_utils

VOCAB = (
    "the a GPU fast token stream model answer small test of to and is runs on Triton SpeedInfer gateway "
    "latency first time every word request worker memory kernel batch queue ready metric"
).split()


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        try:
            import torch
        except ImportError:  # --cpu rehearsal on a host without torch: the same model in numpy
            torch = None
        self.torch = torch
        rng = np.random.default_rng(0)
        v, d = len(VOCAB), 1024
        weights = [rng.standard_normal((v, d)), rng.standard_normal((d, 4 * d)) / d**0.5]
        weights.append(rng.standard_normal((4 * d, v)) / (4 * d) ** 0.5)
        if torch is None:
            self.embed, self.w1, self.w2 = (w.astype(np.float32) for w in weights)
            return
        gpu = args.get("model_instance_kind") == "GPU" and torch.cuda.is_available()
        self.device = f"cuda:{args.get('model_instance_device_id', 0)}" if gpu else "cpu"
        dtype = torch.bfloat16 if gpu else torch.float32
        self.embed, self.w1, self.w2 = (torch.from_numpy(w).to(self.device, dtype) for w in weights)

    def _step(self, ids):
        torch = self.torch
        if torch is None:
            x = self.embed[ids[-8:]].mean(0) @ self.w1
            logits = (0.5 * x * (1 + np.tanh(0.79788456 * (x + 0.044715 * x**3)))) @ self.w2
        else:
            with torch.inference_mode():
                window = torch.tensor(ids[-8:], device=self.device)
                hidden = torch.nn.functional.gelu(self.embed[window].mean(0) @ self.w1)
                logits = (hidden @ self.w2).float().cpu().numpy()
        logits[ids[-1]] = -1e4  # no immediate repeats
        return int(logits.argmax())

    def _generate(self, prompt, limit):
        ids = [sum(w.encode()) % len(VOCAB) for w in prompt.split()] or [0]
        for step in range(limit):
            ids.append(self._step(ids))
            yield step + 1, VOCAB[ids[-1]]

    @staticmethod
    def _tensors(text, prompt_tokens, completion_tokens):
        return [
            pb_utils.Tensor("text_output", np.array([[text.encode("utf-8")]], dtype=np.object_)),
            pb_utils.Tensor("prompt_tokens", np.array([[prompt_tokens]], dtype=np.int32)),
            pb_utils.Tensor("completion_tokens", np.array([[completion_tokens]], dtype=np.int32)),
        ]

    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
            prompt = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
            limit = int(pb_utils.get_input_tensor_by_name(request, "max_tokens").as_numpy().reshape(-1)[0])
            prompt_tokens = len(prompt.split())
            if not self.decoupled:
                words = [w for _, w in self._generate(prompt, limit)]
                responses.append(pb_utils.InferenceResponse(self._tensors(" ".join(words), prompt_tokens, len(words))))
                continue
            sender = request.get_response_sender()
            try:
                for count, word in self._generate(prompt, limit):
                    text = word if count == 1 else " " + word
                    sender.send(pb_utils.InferenceResponse(self._tensors(text, prompt_tokens, count)))
            finally:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None if self.decoupled else responses
'''

CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 8
input [
  {{ name: "text_input", data_type: TYPE_STRING, dims: [ 1 ] }},
  {{ name: "max_tokens", data_type: TYPE_INT32, dims: [ 1 ] }}
]
output [
  {{ name: "text_output", data_type: TYPE_STRING, dims: [ -1 ] }},
  {{ name: "prompt_tokens", data_type: TYPE_INT32, dims: [ 1 ] }},
  {{ name: "completion_tokens", data_type: TYPE_INT32, dims: [ 1 ] }}
]
instance_group [ {{ kind: {kind}, count: 1 }} ]
{decoupled}"""


def say(text: str = "") -> None:
    print(text, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run(command: list[str], *, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    """Run a command of this script's own making; its stdout, or SystemExit with its output on failure."""
    result = subprocess.run(  # noqa: S603 - commands built here, never from outside input
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command[:4])} ...\n{result.stdout}{result.stderr}")
    return result.stdout


# ---------------------------------------------------------------- 1. prerequisites


def gpu_summary() -> tuple[dict[str, Any], str]:
    sys.path.insert(0, str(ROOT))
    from workers.gpu import gpu_read

    reading = gpu_read()
    return reading.metadata, reading.reason


def stub_python(requested: str | None) -> tuple[str, str] | None:
    """(python executable, X.Y) for the Triton venv: one whose shared libpython the backend stub can link."""
    candidates = [requested] if requested else ["python3", "python3.12", "python3.11", "python3.10"]
    for name in candidates:
        path = shutil.which(name) if name else None
        if not path:
            continue
        probe = (
            "import sys, sysconfig; v = f'{sys.version_info[0]}.{sys.version_info[1]}'; "
            "print(v, sysconfig.get_config_var('Py_ENABLE_SHARED') or 0, sys.base_prefix)"
        )
        try:
            version, shared, base = run([path, "-c", probe], timeout=30).split()
        except (SystemExit, ValueError):
            continue
        # The stub links libpython3.X.so.1.0 by name. A distribution's Python (base /usr) pairs with the
        # distribution's libpython; a private static build (pyenv's) does not: the stub crashed under one.
        system_lib = Path(f"/usr/lib/x86_64-linux-gnu/libpython{version}.so.1.0").exists()
        if (shared == "1" or (base == "/usr" and system_lib)) and version in ("3.10", "3.11", "3.12", "3.13"):
            return path, version
    return None


def torch_status(python: str) -> str:
    try:
        return run(
            [python, "-c", "import torch; print(torch.__version__, 'cuda' if torch.cuda.is_available() else 'cpu')"],
            timeout=120,
        ).strip()
    except (SystemExit, subprocess.TimeoutExpired):
        return "missing"


def prerequisites(args: argparse.Namespace) -> dict[str, Any]:
    gpu, reason = gpu_summary()
    found = stub_python(args.triton_python)
    status: dict[str, Any] = {
        "gpu": f"{gpu['count']} x {gpu['product']}" if gpu else f"none ({reason})",
        "triton_python": f"{found[0]} (Python {found[1]})" if found else "none with a shared libpython",
        "torch": torch_status(found[0]) if found else "not checked",
        "triton_venv": str(args.triton_venv) + (" (ready)" if (args.triton_venv / ".installed").exists() else ""),
        "wheels": str(args.wheels) if args.wheels else "PyPI",
    }
    for module in ("openai", "uvicorn", "django"):
        try:
            __import__(module)
            status[module] = "ok"
        except ImportError:
            status[module] = "missing (make install-dev)"
    say("== prerequisites")
    for key, value in status.items():
        say(f"   {key:14} {value}")
    status["_python"] = found
    status["_has_gpu"] = bool(gpu)
    return status


def plan(args: argparse.Namespace, status: dict[str, Any]) -> None:
    found = status["_python"]
    python = found[0] if found else "python3.X"
    say("== plan")
    steps = [
        f"Triton venv {args.triton_venv} from {python} (its packages seen through a .pth): {PYTRITON}, "
        f"{NUMPY_FOR_STUB} forced",
        "model repository: tiny_lm (plain) and tiny_lm_stream (decoupled), torch on the GPU (KIND_GPU)",
        "tritonserver on a free port, wait for /v2/health/ready",
        "SpeedInfer: embedded SQLite in a temporary folder, migrate, registermodel x2, createaccount, grantcredits, "
        "createapikey (chat) and (admin), uvicorn speedinfer.asgi:application",
        "workeragent --once for each worker with DATABASE_URL and REDIS_URL unreachable; print stored gpu_metadata",
        f"probeworkers; {args.requests} requests each (after {args.warmup} warm-ups): openai SDK through the gateway "
        "plain and streamed, the same straight to Triton (/infer, /generate_stream)",
        "print usage settled (/v1/usage, /v1/key) and added latency / time to first token (p50, p90)",
        "prefix affinity: the runtime registered as two workers for a third model; three tenants with long "
        "system prompts and one prompt_cache_key; each stays on one worker (gateway /metrics)",
    ]
    for i, step in enumerate(steps, 1):
        say(f"   {i}. {step}")


# ---------------------------------------------------------------- 2-4. Triton


def pip(python: Path, *packages: str, wheels: Path | None, extra: tuple[str, ...] = ()) -> None:
    source = ["--no-index", "--find-links", str(wheels)] if wheels else []
    run([str(python), "-m", "pip", "install", "-q", *source, *extra, *packages], timeout=1200)


def triton_prepare(venv: Path, python: str, version: str, wheels: Path | None) -> Path:
    """The venv holding tritonserver; returns its site-packages."""
    site = venv / f"lib/python{version}/site-packages"
    if not (venv / ".installed").exists():
        say(f"== Triton venv at {venv}")
        if not (venv / "bin/python").exists():
            run([python, "-m", "venv", str(venv)])
            # The host's torch (a GPU image's own venv, often) stays visible through a .pth, after the venv's
            # own site-packages so that its numpy 1.x wins; --system-site-packages would see the base
            # interpreter's packages, not those of a venv the python belongs to.
            paths = run([python, "-c", "import site; print(chr(10).join(site.getsitepackages()))"]).strip()
            site.mkdir(parents=True, exist_ok=True)
            (site / "zz-host-site-packages.pth").write_text(paths + "\n")
        pip(venv / "bin/python", PYTRITON, wheels=wheels)
        # The backend stub breaks every BYTES tensor under numpy 2 (shared/TRITON_ON_CPU.md).
        pip(venv / "bin/python", NUMPY_FOR_STUB, wheels=wheels, extra=("--no-deps", "--force-reinstall"))
        server = site / "pytriton/tritonserver"
        backend = venv / "backends/python"
        backend.mkdir(parents=True, exist_ok=True)
        for source in (
            server / "backends/python/libtriton_python.so",
            server / "backends/python/triton_python_backend_utils.py",
            server / f"python_backend_stubs/{version}/triton_python_backend_stub",
        ):
            target = backend / source.name
            target.unlink(missing_ok=True)
            target.symlink_to(source)
        (venv / ".installed").touch()
    return site


def model_repository(folder: Path, *, gpu: bool) -> Path:
    repo = folder / "models"
    for name, decoupled in (("tiny_lm", False), ("tiny_lm_stream", True)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1/model.py").write_text(MODEL_PY)
        (repo / name / "config.pbtxt").write_text(
            CONFIG.format(
                name=name,
                kind="KIND_GPU" if gpu else "KIND_CPU",
                decoupled="model_transaction_policy { decoupled: true }\n" if decoupled else "",
            )
        )
    return repo


@contextmanager
def process(command: list[str], *, env: dict[str, str], log: Path, ready_url: str, timeout: float) -> Iterator[None]:
    with log.open("ab") as out:
        child = subprocess.Popen(  # noqa: S603 - our own server binaries
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if child.poll() is not None:
                raise SystemExit(f"{command[0]} exited {child.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
            try:
                if httpx.get(ready_url, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"{command[0]} not ready after {timeout}s:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)
        yield
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGTERM)
            try:
                child.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait(5)


def triton_start(site: Path, venv: Path, repo: Path, folder: Path) -> tuple[str, Any]:
    port = free_port()
    env = {
        **os.environ,
        "PATH": f"{venv}/bin:{os.environ.get('PATH', '')}",
        "LD_LIBRARY_PATH": f"{site}/nvidia_pytriton.libs:{os.environ.get('LD_LIBRARY_PATH', '')}",
    }
    command = [
        str(site / "pytriton/tritonserver/bin/tritonserver"),
        f"--model-repository={repo}",
        f"--backend-directory={venv / 'backends'}",
        "--http-address=127.0.0.1",
        f"--http-port={port}",
        "--allow-grpc=false",
        "--allow-metrics=false",
        "--exit-timeout-secs=5",
    ]
    url = f"http://127.0.0.1:{port}"
    say("== tritonserver")
    return url, process(
        command, env=env, log=folder / "tritonserver.log", ready_url=f"{url}/v2/health/ready", timeout=180
    )


# ---------------------------------------------------------------- 5. SpeedInfer


class SpeedInfer:
    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.folder = folder
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        self.env = {
            **env,
            "SPEEDINFER_VAR_DIR": str(folder / "var"),
            "SECRET_KEY": "gpu-check-secret-key",
            "DEBUG": "0",
            "ALLOWED_HOSTS": "*",
            "PYTHONUNBUFFERED": "1",
        }
        self.chat_key = self.admin_key = ""

    def manage(self, *args: str, env: dict[str, str] | None = None) -> str:
        return run([sys.executable, "manage.py", *args], env={**self.env, **(env or {})})

    def seed(self) -> None:
        say("== SpeedInfer: seed an embedded SQLite")
        self.manage("migrate", "--noinput", "-v", "0")
        for model in (MODEL_PLAIN, MODEL_STREAM, MODEL_AFFINITY):
            self.manage("registermodel", model, "--input-price", "1", "--output-price", "2")
        account = self.manage("createaccount", "gpu-check").strip().splitlines()[-1]
        self.manage("grantcredits", account, "100")
        self.chat_key = self.manage("createapikey", account, "--name", "chat").strip().splitlines()[-1]
        self.admin_key = (
            self.manage("createapikey", account, "--name", "agent", "--scopes", "admin").strip().splitlines()[-1]
        )

    def serve(self) -> Any:
        say(f"== SpeedInfer: uvicorn speedinfer.asgi:application at {self.url}")
        command = [sys.executable, "-m", "uvicorn", "speedinfer.asgi:application", "--host", "127.0.0.1"]
        command += ["--port", str(self.port), "--log-level", "warning", "--no-access-log"]
        return process(
            command, env=self.env, log=self.folder / "speedinfer.log", ready_url=f"{self.url}/health", timeout=60
        )

    def api(self, path: str, key: str) -> Any:
        response = httpx.get(f"{self.url}{path}", headers={"Authorization": f"Bearer {key}"}, timeout=10)
        response.raise_for_status()
        return response.json()


def worker_file(folder: Path, *, worker_id: str, triton_url: str, model: str, stream: bool) -> Path:
    config: dict[str, Any] = {"model_name": "tiny_lm_stream" if stream else "tiny_lm", **TENSORS}
    if stream:
        config["streaming"] = "generate_stream"
    doc = {
        "worker_id": worker_id,
        "worker_type": "nvidia-gpu",
        "runtime": "triton",
        "runtime_endpoint": triton_url,
        "supported_models": [model],
        "runtime_config": config,
        "runtime_metadata": {"runtime": "tritonserver 2.51 (nvidia-pytriton 0.7.0)"},
    }
    path = folder / f"{worker_id}.json"
    path.write_text(json.dumps(doc))
    return path


def agent_report(speedinfer: SpeedInfer, files: list[Path]) -> list[dict[str, Any]]:
    """workeragent --once per worker, in a process that has no database or Redis to reach."""
    say("== workeragent --once (DATABASE_URL and REDIS_URL unreachable)")
    documents = []
    for path in files:
        out = speedinfer.manage(
            "workeragent", "--api", speedinfer.url, "--key", speedinfer.admin_key, str(path), "--once", env=UNREACHABLE
        )
        for line in out.strip().splitlines():
            say(f"   {line}")
        worker_id = json.loads(path.read_text())["worker_id"]
        documents.append(speedinfer.api(f"/api/workers/{worker_id}/", speedinfer.admin_key))
    doc = documents[0]
    say("   gpu_metadata stored: " + json.dumps(doc["gpu_metadata"], indent=None))
    say("   agent status: " + json.dumps(doc["status"]["agent"]))
    text = json.dumps(documents)
    if "serial" in text.lower() or "uuid" in text.lower() or UUID_VALUE.search(text):
        raise SystemExit("a serial number or UUID reached SpeedInfer")
    return documents


# ---------------------------------------------------------------- 7. requests


def percentiles(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return f"p50 {statistics.median(ordered) * 1000:7.1f} ms   p90 {p90 * 1000:7.1f} ms"


def direct_plain(client: httpx.Client, triton: str, max_tokens: int) -> float:
    body = {
        "inputs": [
            {"name": "text_input", "datatype": "BYTES", "shape": [1, 1], "data": [PROMPT]},
            {"name": "max_tokens", "datatype": "INT32", "shape": [1, 1], "data": [max_tokens]},
        ]
    }
    started = time.perf_counter()
    response = client.post(f"{triton}/v2/models/tiny_lm/infer", json=body)
    response.raise_for_status()
    return time.perf_counter() - started


def direct_stream(client: httpx.Client, triton: str, max_tokens: int) -> tuple[float, float]:
    body = {"text_input": PROMPT, "max_tokens": max_tokens, "stream": True}
    started = time.perf_counter()
    first = 0.0
    with client.stream("POST", f"{triton}/v2/models/tiny_lm_stream/generate_stream", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data:") and not first:
                first = time.perf_counter() - started
    return first, time.perf_counter() - started


def measure(speedinfer: SpeedInfer, triton: str, args: argparse.Namespace) -> dict[str, Any]:
    import openai

    say("== probeworkers")
    for line in speedinfer.manage("probeworkers").strip().splitlines():
        say(f"   {line}")
    sdk = openai.OpenAI(base_url=f"{speedinfer.url}/v1", api_key=speedinfer.chat_key, max_retries=0, timeout=60)
    messages: list[Any] = [{"role": "user", "content": PROMPT}]
    timings: dict[str, list[float]] = {
        k: [] for k in ("direct", "gateway", "direct_ttft", "direct_total", "ttft", "total")
    }
    stream_note = ""
    with httpx.Client(timeout=60) as client:
        for i in range(args.warmup + args.requests):
            keep = i >= args.warmup
            took = direct_plain(client, triton, args.max_tokens)
            started = time.perf_counter()
            reply = sdk.chat.completions.create(model=MODEL_PLAIN, messages=messages, max_tokens=args.max_tokens)
            if keep:
                timings["direct"].append(took)
                timings["gateway"].append(time.perf_counter() - started)
            first, total = direct_stream(client, triton, args.max_tokens)
            if keep:
                timings["direct_ttft"].append(first)
                timings["direct_total"].append(total)
            if stream_note:
                continue
            started = time.perf_counter()
            ttft = 0.0
            try:
                stream = sdk.chat.completions.create(
                    model=MODEL_STREAM,
                    messages=messages,
                    max_tokens=args.max_tokens,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content and not ttft:
                        ttft = time.perf_counter() - started
            except openai.APIStatusError as exc:
                stream_note = f"streaming through the gateway refused: HTTP {exc.status_code} {exc.body}"
                continue
            if keep:
                timings["ttft"].append(ttft)
                timings["total"].append(time.perf_counter() - started)
    say(
        f"== {args.requests} requests each, {args.max_tokens} max tokens; "
        f"last reply: {reply.choices[0].message.content!r}"
    )
    say(f"   plain   direct Triton /infer      {percentiles(timings['direct'])}")
    say(f"   plain   through SpeedInfer        {percentiles(timings['gateway'])}")
    added = [g - d for g, d in zip(timings["gateway"], timings["direct"], strict=True)]
    say(f"   plain   added by SpeedInfer       {percentiles(added)}")
    say(f"   stream  direct TTFT               {percentiles(timings['direct_ttft'])}")
    say(f"   stream  direct total              {percentiles(timings['direct_total'])}")
    if stream_note:
        say(f"   stream  {stream_note}")
    else:
        say(f"   stream  TTFT through SpeedInfer   {percentiles(timings['ttft'])}")
        say(f"   stream  total through SpeedInfer  {percentiles(timings['total'])}")
        ttft_added = [g - d for g, d in zip(timings["ttft"], timings["direct_ttft"], strict=True)]
        say(f"   stream  TTFT added                {percentiles(ttft_added)}")
    usage = speedinfer.api("/v1/usage?limit=100", speedinfer.chat_key)["data"]
    key = speedinfer.api("/v1/key", speedinfer.chat_key)["data"]
    say(f"== usage settled: {len(usage)} records")
    fields = ("model", "prompt_tokens", "completion_tokens", "cost", "status", "streamed", "latency_ms", "ttft_ms")
    for record in usage[:3]:
        say("   " + json.dumps({k: record.get(k) for k in fields}))
    tokens = sum(r["total_tokens"] for r in usage)
    cost = sum(Decimal(r["cost"]) for r in usage)
    say(f"   {tokens} tokens, {cost} credits; key balance {key['balance']}, reserved {key['reserved']}")
    return {"timings_s": timings, "stream_note": stream_note, "usage_records": len(usage), "balance": key["balance"]}


# ---------------------------------------------------------------- 8. prefix affinity


def _served_by_worker(speedinfer: SpeedInfer) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{speedinfer.url}/metrics", timeout=10).text
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "speedinfer_requests_total" and sample.labels.get("model") == MODEL_AFFINITY:
                worker = sample.labels.get("worker", "-")
                counts[worker] = counts.get(worker, 0.0) + sample.value
    return counts


def prefix_affinity(speedinfer: SpeedInfer, workers: list[dict[str, Any]], *, requests: int = 4) -> dict[str, Any]:
    """Register `workers` (one runtime under two ids) for MODEL_AFFINITY, then show each tenant sticking."""
    say("== prefix affinity (SPEEDINFER_ROUTING_POLICY=prefix, the default)")
    for doc in workers:
        path = speedinfer.folder / f"{doc['worker_id']}.json"
        path.write_text(json.dumps(doc))
        say("   " + speedinfer.manage("registerworker", str(path)).strip().splitlines()[-1])
    speedinfer.manage("probeworkers")
    placed: dict[str, dict[str, float]] = {}
    with httpx.Client(timeout=60) as client:
        tenants = [(f"tenant {n}", {"system": f"Tenant {n} handbook. " * 60}) for n in range(3)]
        tenants.append(("prompt_cache_key", {"prompt_cache_key": "gpu-check-user-7"}))
        for name, how in tenants:
            before = _served_by_worker(speedinfer)
            for i in range(requests):
                messages = [{"role": "user", "content": f"{PROMPT} ({name}, question {i})"}]
                if "system" in how:
                    messages.insert(0, {"role": "system", "content": how["system"]})
                body: dict[str, Any] = {"model": MODEL_AFFINITY, "max_tokens": 8, "messages": messages}
                if "prompt_cache_key" in how:
                    body["prompt_cache_key"] = how["prompt_cache_key"]
                response = client.post(
                    f"{speedinfer.url}/v1/chat/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {speedinfer.chat_key}"},
                )
                response.raise_for_status()
                cached = ((response.json().get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
                if cached is not None and i == requests - 1:
                    say(f"   {name}: last request's cached_tokens {cached} (the runtime's prefix cache)")
            after = _served_by_worker(speedinfer)
            delta = {w: after.get(w, 0.0) - before.get(w, 0.0) for w in after if after.get(w, 0.0) > before.get(w, 0.0)}
            placed[name] = delta
            say(f"   {name}: " + ", ".join(f"{int(n)} on {w}" for w, n in sorted(delta.items())))
    sticky = all(len(delta) == 1 for delta in placed.values())
    say("   every tenant stayed on one worker" if sticky else "   a tenant was split across workers")
    return {"placed": placed, "sticky": sticky}


def affinity_workers(*, endpoint: str, runtime: str, config: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "worker_id": f"gpu-check-affinity-{suffix}",
            "worker_type": "nvidia-gpu",
            "runtime": runtime,
            "runtime_endpoint": endpoint,
            "supported_models": [MODEL_AFFINITY],
            "runtime_config": config,
        }
        for suffix in ("a", "b")
    ]


@contextmanager
def simulators(folder: Path) -> Iterator[list[str]]:
    """Two simulators with the GPU model (the dry run's stand-in for a runtime with a prefix cache)."""
    with ExitStack() as stack:
        urls = []
        for i in range(2):
            port = free_port()
            command = [sys.executable, "-m", "devtools.simulator", "--port", str(port), "--model", MODEL_AFFINITY]
            command += ["--kv-blocks", "512", "--max-concurrency", "4"]
            url = f"http://127.0.0.1:{port}"
            log = folder / f"simulator-{i}.log"
            stack.enter_context(
                process(command, env=dict(os.environ), log=log, ready_url=f"{url}/v1/models", timeout=30)
            )
            urls.append(f"{url}/v1")
        yield urls


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dry-run", action="store_true", help="no GPU: prerequisites, plan, SpeedInfer and the agent")
    parser.add_argument("--triton-venv", type=Path, default=Path.home() / ".cache/speedinfer/gpu-triton-venv")
    parser.add_argument(
        "--triton-python", help="the Python for the Triton venv (default: the first with a shared libpython)"
    )
    parser.add_argument(
        "--wheels", type=Path, help="install offline from this wheelhouse (pip --no-index --find-links)"
    )
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="rehearse the whole run on a host without a GPU (KIND_CPU, numpy if no torch)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)

    status = prerequisites(args)
    plan(args, status)
    missing = [m for m in ("openai", "uvicorn", "django") if status[m] != "ok"]
    if missing:
        say(f"missing in {sys.executable}: {', '.join(missing)}")
        return 1
    if not args.dry_run and not args.cpu and not status["_has_gpu"]:
        say("no NVIDIA GPU here (see prerequisites): run with --dry-run, or on a GPU machine")
        return 1
    if not args.dry_run and not status["_python"]:
        say("no Python with a shared libpython for the Triton backend stub: pass --triton-python")
        return 1

    result: dict[str, Any] = {"dry_run": args.dry_run}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp, ExitStack() as stack:
        folder = Path(tmp)
        if args.dry_run:
            # The agent checks a runtime that is not there: it must still register, not ready, without GPU metadata.
            triton_url = f"http://127.0.0.1:{free_port()}"
        else:
            python, version = status["_python"]
            site = triton_prepare(args.triton_venv, python, version, args.wheels)
            repo = model_repository(folder, gpu=not args.cpu)
            triton_url, triton = triton_start(site, args.triton_venv, repo, folder)
            stack.enter_context(triton)
            say(f"   ready at {triton_url}")
        speedinfer = SpeedInfer(folder)
        speedinfer.seed()
        stack.enter_context(speedinfer.serve())
        files = [
            worker_file(folder, worker_id="gpu-check-plain", triton_url=triton_url, model=MODEL_PLAIN, stream=False),
            worker_file(folder, worker_id="gpu-check-stream", triton_url=triton_url, model=MODEL_STREAM, stream=True),
        ]
        documents = agent_report(speedinfer, files)
        result["gpu_metadata"] = documents[0]["gpu_metadata"]
        result["agent"] = documents[0]["status"]["agent"]
        if args.dry_run:
            if status["_has_gpu"] != bool(documents[0]["gpu_metadata"]):
                say("the stored GPU metadata does not match what NVML says here")
                return 1
            if documents[0]["status"]["agent"]["runtime_ready"] is not False:
                say("the agent reported a runtime that is not running as ready")
                return 1
            sims = stack.enter_context(simulators(folder))
            docs = affinity_workers(endpoint=sims[0], runtime="cuda", config={"transport": "openai"})
            docs[1]["runtime_endpoint"] = sims[1]
            affinity = prefix_affinity(speedinfer, docs)
            result["affinity"] = affinity
            if not affinity["sticky"]:
                return 1
            say("== dry run passed: SpeedInfer started, the agent registered both workers through the API")
        else:
            result.update(measure(speedinfer, triton_url, args))
            config = {"model_name": "tiny_lm", **TENSORS}
            result["affinity"] = prefix_affinity(
                speedinfer, affinity_workers(endpoint=triton_url, runtime="triton", config=config)
            )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
