"""The LoRA adapters' low-rank term on CUDA: out[rows, col:col + n_out] += scale * B (A x[rows]), the twin
of engine/cpu/lora.py's `lora_add` (same arguments, same float32 semantics; engine/lora.py says which rows
run under which adapter).

Two kernels, float32 sums as the CPU kernel's. `down`: t = A x[rows], a block per (row, rank index): the
block's threads take the inputs round-robin, then one fixed shared-memory tree adds the threads' sums;
`up`: a thread per output (row, column) sums t's rank products in rank order, scales and adds. Every sum's
order depends on the block size only, never on which rows share the call, so a row's bits do not depend
on the batch. An F16 adapter's inputs (x, then t) are rounded to float16 first, as ggml's F16 dot products
take them. The results are within float32 rounding of the CPU kernel's, not its bits: the orders differ
(a tree over the block's threads here, LANES lanes there) and the GPU fuses multiply-adds.

An adapter matrix's A and B are uploaded once, the first time a call passes its LoraWeight, and kept
while that weight lives (engine/lora.py's LoraAdapter holds it, for as long as the adapter is served or
held by a request): no transfer per call but the rows' indices.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import numpy as np
from numba import cuda, float32
from numba.types import float16

from engine.cuda.arrays import THREADS, DeviceArray, blocks, device, elem_blocks, ids, write_back
from engine.cuda.ops import MAX_THREADS, block_sum

if TYPE_CHECKING:
    from engine.lora import LoraWeight

__all__ = ["lora_add", "uploaded"]

SUM_THREADS = 128  # threads of a `down` block (a power of two, <= ops.MAX_THREADS): its sums reduce

# id(weight) -> (weak reference to it, device A, device B transposed); the weight's finalizer drops the entry
_DEVICE: dict[int, tuple[weakref.ref[Any], DeviceArray, DeviceArray]] = {}


def uploaded(w: LoraWeight) -> tuple[DeviceArray, DeviceArray]:
    """The device copies of an adapter matrix's A and B transposed: uploaded on first use, dropped with
    the weight."""
    key = id(w)
    hit = _DEVICE.get(key)
    if hit is not None and hit[0]() is w:
        return hit[1], hit[2]
    a = cuda.to_device(np.ascontiguousarray(w.a, dtype=np.float32))
    b = cuda.to_device(np.ascontiguousarray(w.bt, dtype=np.float32))  # [rank, n_out]: `up` reads rows
    _DEVICE[key] = (weakref.ref(w), a, b)
    weakref.finalize(w, _DEVICE.pop, key, None)
    return a, b


def lora_add(x: Any, rows: np.ndarray, w: LoraWeight, scale: float, out: Any, col: int) -> None:
    """out[rows, col:col + n_out] += float32(scale) * (B (A x[rows])) for the adapter matrix `w` (its A, B
    uploaded once); x and out device or host arrays; an F16 adapter rounds x and A x to float16 first."""
    n_rows = len(rows)
    if n_rows == 0:
        return
    a, b = uploaded(w)
    dx, dout, drows = device(x), device(out), ids(rows)
    t = cuda.device_array((n_rows, w.rank), dtype=np.float32)
    _down[blocks(n_rows * w.rank), min(SUM_THREADS, MAX_THREADS)](dx, drows, a, w.f16, t)
    n = n_rows * b.shape[1]
    _up[elem_blocks(n, THREADS), THREADS](t, drows, b, np.float32(scale), np.int32(col), dout)
    write_back(out, dout)


# ---------------------------------------------------------------------------------------------------
# Kernels. Jobs are strided over the grid (a launch may have fewer blocks than jobs).


def _down_py(x, rows, a, f16, t):  # type: ignore[no-untyped-def]
    """t[i, r] = sum over k of x[rows[i], k] * a[r, k]: a block per (i, r), a fixed tree over its threads."""
    sm = cuda.shared.array(MAX_THREADS, float32)
    tid = cuda.threadIdx.x
    n = cuda.blockDim.x
    rank, n_in = a.shape[0], a.shape[1]
    for job in range(cuda.blockIdx.x, t.shape[0] * rank, cuda.gridDim.x):
        i = job // rank
        r = job - i * rank
        src = rows[i]
        acc = float32(0.0)
        for k in range(tid, n_in, n):
            v = x[src, k]
            if f16:
                v = float32(float16(v))
            acc += v * a[r, k]
        sm[tid] = acc
        total = block_sum(sm, tid, n)  # every thread gets it; sm may be refilled at once
        if tid == 0:
            t[i, r] = float32(float16(total)) if f16 else total


def _up_py(t, rows, bt, scale, col, out):  # type: ignore[no-untyped-def]
    """out[rows[i], col + j] += scale * (sum over r of t[i, r] * bt[r, j]), a thread per (i, j), r in order
    (B transposed: neighbouring threads read neighbouring columns)."""
    rank, n_out = bt.shape[0], bt.shape[1]
    for e in range(cuda.grid(1), t.shape[0] * n_out, cuda.gridsize(1)):
        i = e // n_out
        j = e - i * n_out
        acc = float32(0.0)
        for r in range(rank):
            acc += t[i, r] * bt[r, j]
        out[rows[i], col + j] += scale * acc


_down = cuda.jit(_down_py)
_up = cuda.jit(_up_py)
