"""The kernel set a model runs on. Models call kernels only through a Backend, so CPU and CUDA swap."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Backend:
    name: str  # as llama-bench's "backend" column shows it
    pack_weight: Callable[..., Any]
    matmul: Callable[..., None]
    get_rows: Callable[..., None]
    rmsnorm: Callable[..., None]
    rope: Callable[..., None]
    store_kv: Callable[..., None]
    attention: Callable[..., None]
    silu_mul: Callable[..., None]
    gelu_mul: Callable[..., None]
    add_inplace: Callable[..., None]
    scale_inplace: Callable[..., None]


def cpu_backend(n_threads: int | None = None) -> Backend:
    import numba

    from engine import quant
    from engine.cpu import matmul, ops

    if n_threads:
        numba.set_num_threads(min(n_threads, numba.config.NUMBA_NUM_THREADS))
    return Backend(
        name="CPU",
        pack_weight=quant.pack_weight,
        matmul=matmul.matmul,
        get_rows=matmul.get_rows,
        rmsnorm=ops.rmsnorm,
        rope=ops.rope,
        store_kv=ops.store_kv,
        attention=ops.attention,
        silu_mul=ops.silu_mul,
        gelu_mul=ops.gelu_mul,
        add_inplace=ops.add_inplace,
        scale_inplace=ops.scale_inplace,
    )


def select_backend(device: str = "cpu", n_threads: int | None = None) -> Backend:
    if device in ("cpu", "auto"):
        return cpu_backend(n_threads)
    raise ValueError(f"unknown device '{device}' (available: cpu)")
