"""Local GPU metadata for a worker host's registration, read through NVML (nvidia-ml-py).

Only what the spec lets a worker publish: product name, count, memory, driver and CUDA driver
versions, plus live utilisation and memory use. Never the serial number or UUID, which NVML would
also give: this module never asks NVML for them, and drops any value shaped like a GPU UUID (a MIG
device's name can embed one). With no GPU or no driver, empty metadata and the reason why.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("speedinfer.gpu")

MIB = 1024 * 1024
# The same shape workers.registration refuses: sending one would get the whole registration refused.
_UUID_VALUE = re.compile(r"(?i)\b(gpu-|mig-)?[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")


@dataclass(frozen=True)
class GpuReading:
    """What NVML said: `metadata` is the registration's gpu_metadata ({} when none), `reason` why none."""

    metadata: dict[str, Any] = field(default_factory=dict)
    reason: str = ""


def gpu_read() -> GpuReading:
    try:
        import pynvml
    except ImportError:
        return GpuReading(reason="nvidia-ml-py (pynvml) is not installed")
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError: no libnvidia-ml, no driver, or no device on this host
        return GpuReading(reason=f"NVML is not available on this host ({_error_text(exc)})")
    try:
        return _read(pynvml)
    except Exception as exc:
        log.warning("reading GPU metadata through NVML failed", exc_info=True)
        return GpuReading(reason=f"reading NVML failed ({_error_text(exc)})")
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: S110 - nothing to do about a failing shutdown; the reading stands
            pass


def local_gpu_metadata() -> dict[str, Any]:
    return gpu_read().metadata


def _read(pynvml: Any) -> GpuReading:
    count = int(pynvml.nvmlDeviceGetCount())
    if count == 0:
        return GpuReading(reason="NVML sees no GPU on this host")
    gpus: list[dict[str, Any]] = []
    for index in range(count):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        gpu: dict[str, Any] = {
            "index": index,
            "product": _clean(_text(pynvml.nvmlDeviceGetName(handle))),
            "memory_total_mib": int(memory.total) // MIB,
            "memory_used_mib": int(memory.used) // MIB,
        }
        # Utilisation is not supported everywhere (MIG instances, some vGPUs): leave the figure out there.
        utilization = _optional(pynvml.nvmlDeviceGetUtilizationRates, handle)
        if utilization is not None:
            gpu["utilization_percent"] = int(utilization.gpu)
        gpus.append(gpu)
    metadata: dict[str, Any] = {
        "source": "nvml",
        "product": ", ".join(dict.fromkeys(g["product"] for g in gpus)),
        "count": count,
        "memory_total_mib": sum(g["memory_total_mib"] for g in gpus),
        "memory_used_mib": sum(g["memory_used_mib"] for g in gpus),
        "driver_version": _clean(_text(pynvml.nvmlSystemGetDriverVersion())),
    }
    cuda = _optional(pynvml.nvmlSystemGetCudaDriverVersion)
    if cuda is not None:
        # NVML gives 12040 for CUDA 12.4.
        metadata["cuda_driver_version"] = f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}"
    figures = [g["utilization_percent"] for g in gpus if "utilization_percent" in g]
    if figures:
        metadata["utilization_percent"] = round(sum(figures) / len(figures))
    metadata["gpus"] = gpus
    return GpuReading(metadata=metadata)


def _optional(function: Any, *args: Any) -> Any:
    try:
        return function(*args)
    except Exception:  # NVMLError_NotSupported and friends: a figure this device doesn't give
        return None


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _clean(value: str) -> str:
    return _UUID_VALUE.sub("", value).strip()


def _error_text(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return _clean(text)[:200]
