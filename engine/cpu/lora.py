"""The LoRA adapters' low-rank term on the CPU: out[rows, cols] += scale * B (A x[rows]), llama.cpp's
build_lora_mm after the base matmul (engine/lora.py says which rows run under which adapter).

Two steps per row, each summing in one order whatever else is in the batch, so a sequence's outputs are
bitwise the same alone or batched with rows under other adapters, and the same on every level with FMA
(by construction: fixed lanes, no reassociation; checked at avx2 and portable only):
- down, t = A x (A [rank, n_in]): per rank a dot over n_in in LANES fixed lanes folded in one tree
  (engine/cpu/lanes.py), four ranks at a time sharing the loads of x;
- up, d = B t (B transposed, [rank, n_out]): per output a sum over the ranks in rank order, vectorised
  across outputs (no reduction across lanes, so no reassociation is needed to vectorise it).
The scalar tails (a rank not a multiple of 4, outputs past the last block of 64) add in the same order.
An F16 adapter's inputs (x, then t) are rounded to float16 first, as ggml's F16 dot products take them.

Cost, avx2, one thread, Qwen2.5-Coder 1.5B's 7 matrices x 28 layers, rank 16: 1 / 4 / 16 rows 5.3 / 12.9 /
38.2 ms (3.5 / 5.7 / 7.7 GMAC/s; the scalar float64 loop this replaced ~0.5). Served, 16 streams over 4
adapters: scripts/bench_lora.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numba import njit, prange

from engine.cpu.f16 import float_to_half, half_to_float
from engine.cpu.lanes import LANES, ORDERED, lane_total, zero_lanes

if TYPE_CHECKING:
    from engine.lora import LoraWeight

__all__ = ["lora_add", "lora_rows"]

UP_BLOCK = 4 * LANES  # outputs summed side by side in the up step: the four rows of zero_lanes


@njit(inline="always", fastmath=ORDERED, error_model="numpy")
def _dot4(x: np.ndarray, a: np.ndarray, r0: int) -> tuple[np.float32, np.float32, np.float32, np.float32]:
    """Four dots x . a[r0 + q]: lane k % LANES adds its k in order, then one fixed fold per dot. The four
    rows are written out (not a loop over q): so LLVM keeps the lanes in registers and vectorises them."""
    n = x.shape[0]
    whole = n - n % LANES
    acc = zero_lanes()
    for k0 in range(0, whole, LANES):
        for lane in range(LANES):
            xk = x[k0 + lane]
            acc[0, lane] += xk * a[r0, k0 + lane]
            acc[1, lane] += xk * a[r0 + 1, k0 + lane]
            acc[2, lane] += xk * a[r0 + 2, k0 + lane]
            acc[3, lane] += xk * a[r0 + 3, k0 + lane]
    for k in range(whole, n):
        xk = x[k]
        acc[0, k - whole] += xk * a[r0, k]
        acc[1, k - whole] += xk * a[r0 + 1, k]
        acc[2, k - whole] += xk * a[r0 + 2, k]
        acc[3, k - whole] += xk * a[r0 + 3, k]
    return lane_total(acc[0]), lane_total(acc[1]), lane_total(acc[2]), lane_total(acc[3])


@njit(inline="always", fastmath=ORDERED, error_model="numpy")
def _dot1(x: np.ndarray, w: np.ndarray) -> np.float32:
    """One dot x . w in the same lanes and fold as each of _dot4's (a rank that is not a multiple of 4)."""
    n = x.shape[0]
    whole = n - n % LANES
    acc = zero_lanes()
    for k0 in range(0, whole, LANES):
        for lane in range(LANES):
            acc[0, lane] += x[k0 + lane] * w[k0 + lane]
    for k in range(whole, n):
        acc[0, k - whole] += x[k] * w[k]
    return lane_total(acc[0])


# Called (not inlined) from the prange loops: inside a parfor body zero_lanes' stack rows are allocated
# in the loop, where LLVM does not promote them to registers (the up step ran 9x slower that way).
@njit(cache=True, nogil=True, fastmath=ORDERED, error_model="numpy")
def _down_row(x: np.ndarray, a: np.ndarray, f16: bool, t: np.ndarray) -> None:
    """t[r] = A[r] . x for every rank r; an F16 adapter's x and t rounded to float16 (ggml's F16 dots)."""
    if f16:
        rounded = np.empty_like(x)
        for k in range(x.shape[0]):
            rounded[k] = half_to_float(float_to_half(x[k]))
        x = rounded
    rank = a.shape[0]
    whole = rank - rank % 4
    for r0 in range(0, whole, 4):
        t[r0], t[r0 + 1], t[r0 + 2], t[r0 + 3] = _dot4(x, a, r0)
    for r in range(whole, rank):
        t[r] = _dot1(x, a[r])
    if f16:
        for r in range(rank):
            t[r] = half_to_float(float_to_half(t[r]))


@njit(inline="always", fastmath=ORDERED, error_model="numpy")
def _up_block(t: np.ndarray, bt: np.ndarray, j0: int, scale: np.float32, out: np.ndarray) -> None:
    """out[j0 + j] += scale * sum over r of t[r] bt[r, j0 + j] for j < UP_BLOCK, the r in order: the
    block's sums held in zero_lanes' registers while every rank adds to them."""
    acc = zero_lanes()
    # Through views indexed from 0: an index j0 + lane would make numba wrap negative indices per element
    # (a scalar gather in place of one vector load; 9x slower).
    o = out[j0 : j0 + UP_BLOCK]
    for r in range(bt.shape[0]):
        tr = t[r]
        w = bt[r, j0 : j0 + UP_BLOCK]
        for lane in range(LANES):
            acc[0, lane] += tr * w[lane]
            acc[1, lane] += tr * w[LANES + lane]
            acc[2, lane] += tr * w[2 * LANES + lane]
            acc[3, lane] += tr * w[3 * LANES + lane]
    for q in range(4):
        for lane in range(LANES):
            o[q * LANES + lane] += scale * acc[q, lane]


@njit(inline="always", fastmath=ORDERED, error_model="numpy")
def _up_tail(t: np.ndarray, bt: np.ndarray, j: int, scale: np.float32, out: np.ndarray) -> None:
    """One output past the last whole block, added in the same order as _up_block's."""
    d = np.float32(0.0)
    for r in range(bt.shape[0]):
        d += t[r] * bt[r, j]
    out[j] += scale * d


@njit(cache=True, nogil=True, fastmath=ORDERED, error_model="numpy")
def _up_block_rows(
    t: np.ndarray, rows: np.ndarray, bt: np.ndarray, b: int, scale: np.float32, out: np.ndarray, col: int
) -> None:
    """Output block b (the tail when b is past the last whole block) of every row."""
    n_out = bt.shape[1]
    whole = n_out - n_out % UP_BLOCK
    for i in range(rows.shape[0]):
        row = out[rows[i], col : col + n_out]
        if b * UP_BLOCK < whole:
            _up_block(t[i], bt, b * UP_BLOCK, scale, row)
        else:
            for j in range(whole, n_out):
                _up_tail(t[i], bt, j, scale, row)


@njit(parallel=True, cache=True, nogil=True, fastmath=ORDERED, error_model="numpy")
def lora_rows(
    x: np.ndarray,
    rows: np.ndarray,
    a: np.ndarray,
    bt: np.ndarray,
    f16: bool,
    scale: np.float32,
    out: np.ndarray,
    col: int,
) -> None:
    """out[rows[i], col:col + n_out] += scale * B (A x[rows[i]]) for each i: both steps in one call (per
    call the Python side costs one dispatch: with numpy's float16 rounding and two kernels an F16 adapter
    took 204 us a call, 4 rows of Qwen 1.5B, and 160 of a 16-row decode step's 619 ms)."""
    t = np.empty((rows.shape[0], a.shape[0]), np.float32)
    for i in prange(rows.shape[0]):
        _down_row(x[rows[i]], a, f16, t[i])
    # The up step in parallel over blocks of outputs, every row within a block: the block's 4 KB of B
    # stays in L1 while the rows pass (a row at a time re-read all of B, 573 KB at Qwen 1.5B's FFN).
    n_out = bt.shape[1]
    for b in prange(n_out // UP_BLOCK + (n_out % UP_BLOCK > 0)):
        _up_block_rows(t, rows, bt, b, scale, out, col)


def lora_add(x: np.ndarray, rows: np.ndarray, w: LoraWeight, scale: float, out: np.ndarray, col: int) -> None:
    """out[rows, col:col + n_out] += float32(scale) * (B (A x[rows])) for the adapter matrix `w`; an F16
    adapter rounds x and A x to float16 first (as ggml computes it)."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    lora_rows(x, rows, w.a, w.bt, w.f16, np.float32(scale), out, col)
