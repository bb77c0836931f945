"""Local GPU metadata for a worker host's registration, read through NVML (nvidia-ml-py).

Only what the spec lets a worker publish: name, driver, CUDA driver version, memory. Never the
serial or UUID, which NVML would also give. With no GPU or no driver, an empty list.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("speedinfer.gpu")


def local_gpu_metadata() -> list[dict[str, Any]]:
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError: no driver or no device on this host
        return []
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(
                {
                    "index": index,
                    "product": _text(pynvml.nvmlDeviceGetName(handle)),
                    "driver_version": driver,
                    "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}",
                    "memory_total_mib": int(memory.total) // (1024 * 1024),
                }
            )
        return gpus
    except Exception:
        log.warning("reading GPU metadata through NVML failed", exc_info=True)
        return []
    finally:
        pynvml.nvmlShutdown()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
