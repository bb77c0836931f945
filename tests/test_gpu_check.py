"""`make gpu-check --dry-run`: without a GPU, the GPU check's every step that needs none runs and passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_gpu_check_dry_run_starts_speedinfer_and_the_agent_registers_through_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    result = subprocess.run(  # noqa: S603 - our own script
        [sys.executable, "devtools/gpu_check.py", "--dry-run", "--json", str(tmp_path / "result.json")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "== plan" in out and "tritonserver on a free port" in out
    assert "created worker gpu-check-plain" in out and "created worker gpu-check-stream" in out
    assert "dry run passed" in out
    # Step 8 against two simulators: each tenant's requests, and the prompt_cache_key's, stay on one worker.
    assert "== prefix affinity" in out and "every tenant stayed on one worker" in out
    assert "prompt_cache_key: 4 on gpu-check-affinity-" in out
    # Whatever this host has, nothing identifying a GPU reaches SpeedInfer (the script checks it too).
    assert "serial" not in out.lower() and "uuid" not in out.lower()
    assert (tmp_path / "result.json").exists()
