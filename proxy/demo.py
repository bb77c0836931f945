"""The embedded demo's workers (see `manage.py seeddemo` and `manage.py rundemo`).

`make run` starts the bundled worker simulator (workers/simulator.py) on
SPEEDINFER_SIMULATOR_PORT (8100) and registers it as a CUDA worker speaking the
OpenAI-compatible transport, serving the demo model.
"""

from __future__ import annotations

import os

DEMO_MODEL = "acme/model-1"
DEMO_WORKER_ID = "demo-cuda-simulator"


def simulator_port() -> int:
    return int(os.environ.get("SPEEDINFER_SIMULATOR_PORT", "8100"))


def seed_workers() -> None:
    """Register demo workers pointing at the bundled worker simulator (idempotent)."""
    from workers.services import worker_register

    worker_register(
        data={
            "worker_id": DEMO_WORKER_ID,
            "worker_type": "nvidia-gpu",
            "runtime": "cuda",
            "runtime_endpoint": f"http://127.0.0.1:{simulator_port()}/v1",
            "supported_models": [DEMO_MODEL],
            "runtime_config": {"transport": "openai"},
            "runtime_metadata": {"cuda_version": "simulated"},
            "gpu_metadata": {"product": "SpeedInfer worker simulator"},
        }
    )
