"""The LoRA adapters' low-rank term on the CPU: out[rows, cols] += scale * B (A x[rows]), llama.cpp's
build_lora_mm after the base matmul (engine/lora.py says which rows run under which adapter).

Each row's products are summed in float64 in one order whatever else is in the batch (a scalar loop per
output, no tiles): a row's result does not depend on which rows share its call, so a sequence's outputs
are bitwise the same alone or batched with rows under other adapters. An F16 adapter's inputs are
rounded to float16 first, as ggml's F16 dot products take them (its vec_dot_type).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from engine.cpu.lanes import ORDERED

__all__ = ["lora_add", "lowrank"]


@njit(parallel=True, cache=True, nogil=True, fastmath=ORDERED, error_model="numpy")
def lowrank(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """out[i, j] = sum over k of x[i, k] * w[j, k] (float64 sums in k order, rounded to float32)."""
    n, m, kk = x.shape[0], w.shape[0], x.shape[1]
    for i in prange(n):
        for j in range(m):
            acc = 0.0
            for k in range(kk):
                acc += np.float64(x[i, k]) * np.float64(w[j, k])
            out[i, j] = np.float32(acc)


def _f16_rounded(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def lora_add(
    x: np.ndarray,
    rows: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    scale: float,
    f16: bool,
    out: np.ndarray,
    col: int,
) -> None:
    """out[rows, col:col + n_out] += float32(scale) * (B (A x[rows])); a float32 [rank, n_in], b float32
    [n_out, rank]; f16: round x and A x to float16 first (an F16 adapter, as ggml computes it)."""
    xr = np.ascontiguousarray(x[rows], dtype=np.float32)
    if f16:
        xr = _f16_rounded(xr)
    t = np.empty((len(rows), a.shape[0]), np.float32)
    lowrank(xr, a, t)
    if f16:
        t = _f16_rounded(t)
    d = np.empty((len(rows), b.shape[0]), np.float32)
    lowrank(t, b, d)
    d *= np.float32(scale)
    out[rows, col : col + b.shape[0]] += d
