"""The embedded demo's workers (see `manage.py seeddemo` and `manage.py rundemo`).

`make run` starts the bundled worker simulator (devtools/simulator.py) on
SPEEDINFER_SIMULATOR_PORT (8100) and registers it as a CUDA worker speaking the
OpenAI-compatible transport, serving the demo model and the demo embedding model
(DEMO_EMBED_MODEL: the simulator answers POST /v1/embeddings too). Where the real Triton
server is installed (`make triton`), it also starts one on
SPEEDINFER_DEMO_TRITON_PORT (8101) over tests/triton_models and registers it,
with spec 002's registration, as a direct Triton worker for DEMO_TRITON_MODEL, and a second Triton
worker over the decoupled model `text_stream` with `"streaming": "generate_stream"` for
DEMO_TRITON_STREAM_MODEL, so `stream: true` works from Triton too.
"""

from __future__ import annotations

import os

from catalog.services import model_register
from core.credits import MICRO
from devtools.tritonserver import triton_installed
from workers.services import worker_register

DEMO_MODEL = "acme/model-1"
DEMO_EMBED_MODEL = "acme/embed-1"
DEMO_RERANK_MODEL = "acme/rerank-1"
DEMO_WORKER_ID = "demo-cuda-simulator"
DEMO_TRITON_MODEL = "acme/triton-demo"
DEMO_TRITON_WORKER_ID = "demo-triton"
DEMO_TRITON_STREAM_MODEL = "acme/triton-stream-demo"
DEMO_TRITON_STREAM_WORKER_ID = "demo-triton-stream"


def simulator_port() -> int:
    return int(os.environ.get("SPEEDINFER_SIMULATOR_PORT", "8100"))


def triton_port() -> int:
    return int(os.environ.get("SPEEDINFER_DEMO_TRITON_PORT", "8101"))


def seed_workers() -> None:
    """Register demo workers pointing at the bundled worker simulator (idempotent)."""
    model_register(
        model_id=DEMO_EMBED_MODEL, input_price=MICRO // 10, output_price=0, max_output_tokens=1, kind="embeddings"
    )
    model_register(
        model_id=DEMO_RERANK_MODEL, input_price=MICRO // 10, output_price=0, max_output_tokens=1, kind="rerank"
    )
    worker_register(
        data={
            "worker_id": DEMO_WORKER_ID,
            "worker_type": "nvidia-gpu",
            "runtime": "cuda",
            "runtime_endpoint": f"http://127.0.0.1:{simulator_port()}/v1",
            "supported_models": [DEMO_MODEL, DEMO_EMBED_MODEL, DEMO_RERANK_MODEL],
            "runtime_config": {"transport": "openai"},
            "runtime_metadata": {"cuda_version": "simulated"},
            "gpu_metadata": {"product": "SpeedInfer worker simulator"},
        }
    )
    if not triton_installed():
        return
    model_register(model_id=DEMO_TRITON_MODEL, input_price=MICRO // 2, output_price=MICRO, max_output_tokens=256)
    worker_register(
        data={
            "worker_id": DEMO_TRITON_WORKER_ID,
            "worker_type": "nvidia-gpu",
            "runtime": "triton",
            "runtime_endpoint": f"http://127.0.0.1:{triton_port()}",
            "supported_models": [DEMO_TRITON_MODEL],
            "runtime_config": {
                "model_name": "text_generation",
                "input_name": "text_input",
                "max_tokens_input_name": "max_tokens",
                "output_name": "text_output",
                "prompt_tokens_output_name": "prompt_tokens",
                "completion_tokens_output_name": "completion_tokens",
            },
            "runtime_metadata": {"backend": "python (CPU)"},
        }
    )
    # A decoupled model (one word per response, 100 ms apart) behind Triton's generate extension, with
    # TensorRT-LLM's count names: the registration a TensorRT-LLM ensemble takes (see README, Workers).
    model_register(model_id=DEMO_TRITON_STREAM_MODEL, input_price=MICRO // 2, output_price=MICRO, max_output_tokens=256)
    worker_register(
        data={
            "worker_id": DEMO_TRITON_STREAM_WORKER_ID,
            "worker_type": "nvidia-gpu",
            "runtime": "triton",
            "runtime_endpoint": f"http://127.0.0.1:{triton_port()}",
            "supported_models": [DEMO_TRITON_STREAM_MODEL],
            "runtime_config": {
                "model_name": "text_stream",
                "input_name": "text_input",
                "max_tokens_input_name": "max_tokens",
                "output_name": "text_output",
                "prompt_tokens_output_name": "num_input_tokens",
                "completion_tokens_output_name": "num_output_tokens",
                "streaming": "generate_stream",
            },
            "runtime_metadata": {"backend": "python (CPU), decoupled"},
        }
    )
