from __future__ import annotations

import json
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.factories import make_model
from workers.models import Worker

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parent.parent

# The spec's four registration examples, exactly as published (001 twice, 002, 003).
SPEC_TRTLLM_TRITON = '{"worker_id":"trtllm-triton-01","worker_type":"nvidia-gpu","runtime":"tensorrt-llm","runtime_endpoint":"http://triton:8000","supported_models":["acme/model-1"],"runtime_config":{"transport":"triton","model_name":"ensemble","input_name":"text_input","max_tokens_input_name":"max_tokens","output_name":"text_output","prompt_tokens_output_name":"prompt_tokens","completion_tokens_output_name":"completion_tokens"},"runtime_metadata":{"backend":"tensorrt-llm"}}'  # noqa: E501
SPEC_TRTLLM_OPENAI = '{"worker_id":"trtllm-api-01","worker_type":"nvidia-gpu","runtime":"tensorrt-llm","runtime_endpoint":"http://trtllm-frontend:8000/v1","supported_models":["acme/model-1"],"runtime_config":{"transport":"openai"},"runtime_metadata":{"backend":"tensorrt-llm"}}'  # noqa: E501
SPEC_TRITON = '{"worker_id":"triton-01","worker_type":"nvidia-gpu","runtime":"triton","runtime_endpoint":"http://triton:8000","supported_models":["acme/model-1"],"runtime_config":{"model_name":"text_generation","input_name":"text_input","max_tokens_input_name":"max_tokens","output_name":"text_output","prompt_tokens_output_name":"prompt_tokens","completion_tokens_output_name":"completion_tokens"}}'  # noqa: E501
SPEC_CUDA = '{"worker_id":"cuda-01","worker_type":"nvidia-gpu","runtime":"cuda","runtime_endpoint":"http://cuda-worker:8000/v1","supported_models":["acme/model-1"],"runtime_config":{"transport":"openai"},"gpu_metadata":{"product":"operator-reported"},"runtime_metadata":{"cuda_version":"operator-reported"}}'  # noqa: E501
SPEC_EXAMPLES = {
    "trtllm-triton-01": (SPEC_TRTLLM_TRITON, "triton"),
    "trtllm-api-01": (SPEC_TRTLLM_OPENAI, "openai"),
    "triton-01": (SPEC_TRITON, "triton"),
    "cuda-01": (SPEC_CUDA, "openai"),
}


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def write(tmp_path: Path, doc: dict | str, name: str = "w.json") -> str:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


@pytest.fixture(autouse=True)
def _model() -> None:
    make_model(model_id="acme/model-1")


def test_the_four_spec_examples_register_unchanged(tmp_path):
    files = [write(tmp_path, text, f"{wid}.json") for wid, (text, _) in SPEC_EXAMPLES.items()]
    out = run("registerworker", *files)
    assert out.count("created worker") == 4
    for wid, (text, transport) in SPEC_EXAMPLES.items():
        worker = Worker.objects.get(worker_id=wid)
        doc = json.loads(text)
        assert worker.transport == transport
        assert worker.runtime == doc["runtime"]
        assert worker.runtime_endpoint == doc["runtime_endpoint"]
        assert worker.runtime_config == doc["runtime_config"]
        assert worker.runtime_metadata == doc.get("runtime_metadata", {})
        assert worker.gpu_metadata == doc.get("gpu_metadata", {})


def test_re_registering_is_idempotent_and_updates(tmp_path):
    path = write(tmp_path, SPEC_CUDA)
    assert "created" in run("registerworker", path)
    assert "updated" in run("registerworker", path)
    assert Worker.objects.filter(worker_id="cuda-01").count() == 1
    changed = json.loads(SPEC_CUDA) | {"runtime_metadata": {"cuda_version": "12.6"}}
    run("registerworker", write(tmp_path, changed))
    assert Worker.objects.get(worker_id="cuda-01").runtime_metadata == {"cuda_version": "12.6"}


@pytest.mark.django_db(transaction=True)
def test_registerworker_reads_stdin_and_exits_1_with_one_line(subprocess_env):
    ok = subprocess.run(
        [sys.executable, "manage.py", "registerworker", "-"],
        input=SPEC_TRITON,
        cwd=ROOT,
        env=subprocess_env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert "triton-01" in ok.stdout
    bad = json.loads(SPEC_TRITON) | {"runtime": "onnx"}
    failed = subprocess.run(
        [sys.executable, "manage.py", "registerworker", "-"],
        input=json.dumps(bad),
        cwd=ROOT,
        env=subprocess_env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert failed.returncode == 1
    assert "Traceback" not in failed.stderr
    assert len(failed.stderr.strip().splitlines()) == 1
    assert "runtime" in failed.stderr and "onnx" in failed.stderr


def _triton(**changes) -> dict:
    doc = json.loads(SPEC_TRITON)
    config = changes.pop("runtime_config", None)
    if config is not None:
        doc["runtime_config"] = {k: v for k, v in {**doc["runtime_config"], **config}.items() if v is not None}
    return doc | changes


BAD = [
    (_triton(runtime="onnx"), "runtime: unknown runtime 'onnx'"),
    (_triton(runtime_config={"model_name": None}), "runtime_config.model_name"),
    (_triton(runtime_config={"input_name": ""}), "runtime_config.input_name"),
    (_triton(runtime_config={"completion_tokens_output_name": None}), "runtime_config.completion_tokens_output_name"),
    (_triton(runtime_config={"cached_tokens_output_name": 3}), "runtime_config.cached_tokens_output_name"),
    (_triton(runtime_config={"cached_tokens_output_name": ""}), "runtime_config.cached_tokens_output_name"),
    (_triton(runtime_config={"transport": "openai"}), "runtime_config.transport"),
    (json.loads(SPEC_TRTLLM_OPENAI) | {"runtime_config": {}}, "runtime_config.transport: is required"),
    (json.loads(SPEC_TRTLLM_OPENAI) | {"runtime_config": {"transport": "grpc"}}, "unknown transport 'grpc'"),
    (json.loads(SPEC_CUDA) | {"runtime_config": {"transport": "triton"}}, "runtime_config.transport"),
    (_triton(runtime_endpoint="ftp://triton:8000"), "runtime_endpoint: must be an http"),
    (_triton(runtime_endpoint="triton:8000"), "runtime_endpoint"),
    (_triton(runtime_endpoint="http://user:pw@triton:8000"), "runtime_endpoint: must not carry credentials"),
    (_triton(supported_models=["acme/unknown"]), "supported_models: 'acme/unknown' is not a registered"),
    (_triton(supported_models=[]), "supported_models"),
    (_triton(gpu_metadata={"serial": "1320"}), "gpu_metadata.serial"),
    (_triton(gpu_metadata={"gpus": [{"name": "H200", "uuid": "x"}]}), "gpu_metadata.gpus[0].uuid"),
    (_triton(gpu_metadata={"id": "GPU-0a1b2c3d-1111-2222-3333-444455556666"}), "gpu_metadata.id"),
    (_triton(runtime_metadata={"hfToken": "x"}), "runtime_metadata.hfToken"),
    (_triton(runtime_metadata={"auth": {"password": "x"}}), "runtime_metadata.auth"),
    (_triton(runtime_metadata={"API-Key": "x"}), "runtime_metadata.API-Key"),
    (_triton(runtime_metadata={"client_secret": "x"}), "runtime_metadata.client_secret"),
    (_triton(runtime_config={"model_map": {"acme/other": "x"}}), "runtime_config.model_map.acme/other"),
    (_triton(worker_id=""), "worker_id"),
    (_triton(colour="blue"), "colour: unknown field"),
    (_triton(runtime_metadata=["x"]), "runtime_metadata: must be a JSON object"),
]


@pytest.mark.parametrize(("doc", "message"), BAD, ids=[m.split(":")[0] + str(i) for i, (_, m) in enumerate(BAD)])
def test_bad_registrations_fail_naming_the_field(tmp_path, doc, message):
    with pytest.raises(CommandError) as info:
        run("registerworker", write(tmp_path, doc))
    assert message in str(info.value)
    assert "\n" not in str(info.value)
    assert not Worker.objects.exists()


def test_bad_json_and_missing_file_are_one_line_errors(tmp_path):
    with pytest.raises(CommandError, match="not valid JSON"):
        run("registerworker", write(tmp_path, "{nope"))
    with pytest.raises(CommandError, match="cannot read"):
        run("registerworker", str(tmp_path / "missing.json"))


def test_upstream_key_is_stored_apart_and_kept_when_omitted(tmp_path):
    doc = json.loads(SPEC_CUDA) | {"upstream_api_key": "sk-upstream-1"}
    out = run("registerworker", write(tmp_path, doc))
    assert "sk-upstream-1" not in out
    worker = Worker.objects.get(worker_id="cuda-01")
    assert worker.upstream_api_key == "sk-upstream-1"
    assert "sk-upstream-1" not in json.dumps(worker.runtime_metadata) + json.dumps(worker.runtime_config)
    run("registerworker", write(tmp_path, SPEC_CUDA))
    assert Worker.objects.get(worker_id="cuda-01").upstream_api_key == "sk-upstream-1"


def test_tensor_names_like_max_tokens_are_not_mistaken_for_credentials(tmp_path):
    doc = _triton(runtime_config={"prompt_tokens_output_name": "num_input_tokens"}, runtime_metadata={"max_tokens": 8})
    run("registerworker", write(tmp_path, doc))
    assert Worker.objects.get(worker_id="triton-01").runtime_config["prompt_tokens_output_name"] == "num_input_tokens"


def test_local_gpu_metadata_degrades_without_a_gpu_and_registers_cleanly(tmp_path):
    from workers.gpu import local_gpu_metadata

    metadata = local_gpu_metadata()
    assert isinstance(metadata, dict)  # {} on a machine without a GPU
    for gpu in metadata.get("gpus", []):
        assert not {"serial", "uuid"} & set(gpu)
    doc = json.loads(SPEC_CUDA) | {"gpu_metadata": metadata}
    run("registerworker", write(tmp_path, doc))


def test_a_triton_embedding_worker_needs_only_its_embeddings_names():
    from django.core.exceptions import ValidationError

    from workers.registration import registration_validate

    make_model(model_id="acme/tri-embed")
    names = {
        "model_name": "text_embedding",
        "input_name": "text_input",
        "output_name": "embedding",
        "prompt_tokens_output_name": "prompt_tokens",
    }
    doc = {
        "worker_id": "triton-embed",
        "runtime": "triton",
        "runtime_endpoint": "http://triton:8000",
        "supported_models": ["acme/tri-embed"],
        "runtime_config": {"embeddings": names},
    }
    assert registration_validate(doc).runtime_config["embeddings"] == names
    for config, field in (
        ({"embeddings": {**names, "output_name": ""}}, "runtime_config.embeddings.output_name"),
        ({"embeddings": {**names, "pooling": "mean"}}, "runtime_config.embeddings.pooling"),
        ({"embeddings": "text_embedding"}, "runtime_config.embeddings"),
        ({"embeddings": names, "model_name": "text_generation"}, "runtime_config.input_name"),
    ):
        with pytest.raises(ValidationError) as info:
            registration_validate({**doc, "runtime_config": config})
        assert field in info.value.message_dict
    with pytest.raises(ValidationError) as info:
        registration_validate({**doc, "runtime": "cuda", "runtime_config": {"embeddings": names}})
    assert "runtime_config.embeddings" in info.value.message_dict
