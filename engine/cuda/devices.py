"""The GPUs numba.cuda sees (for --list-devices) and whether kernels can be compiled for them."""

from __future__ import annotations

import math
from dataclasses import dataclass

from numba import config, cuda

MIB = 1024 * 1024


@dataclass(frozen=True)
class Gpu:
    name: str  # llama.cpp's device name: CUDA0, CUDA1, ...
    description: str  # the product name
    total_mib: int
    free_mib: int


def gpus() -> list[Gpu]:
    found = []
    for i, dev in enumerate(cuda.gpus):
        with dev:
            free, total = cuda.current_context().get_memory_info()
            # numba's built-in simulator has no get_current_device (numba-cuda's has)
            current = getattr(cuda, "get_current_device", None)
            name = getattr(current(), "name", "CUDA simulator") if current else "CUDA simulator"
        description = name.decode() if isinstance(name, bytes) else str(name)
        found.append(Gpu(f"CUDA{i}", description, _mib(total), _mib(free)))
    return found


def _mib(n: float) -> int:
    return int(n) // MIB if math.isfinite(n) else 0  # the simulator reports infinite memory


def nvvm_missing() -> str | None:
    """Why kernels cannot be compiled (NVVM, from the CUDA toolkit wheels, not found), or None."""
    if config.ENABLE_CUDASIM:
        return None
    try:
        from numba.cuda.cudadrv import nvvm

        if nvvm.is_available():
            return None
    except Exception as exc:
        return f"NVVM check failed ({exc})"
    return "NVVM not found: install the cuda extra (pip install 'llamba[cuda]', numba-cuda[cu13] or [cu12])"
