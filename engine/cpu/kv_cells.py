"""The KV cache's cell types inside the CPU kernels: storing a row, and reading cells while attending.

The attention and store kernels (engine/cpu/attention.py) are written once over these functions, which
dispatch on the cache array's element type at compile time (numba `overload`), so keys and values each
get their type's reads without a dequantized copy of the cache:
- uint16: float16 bits (the f16 cache, viewed as uint16: Numba has no CPU float16);
- int8: Q8_0 blocks (the q8_0 cache's bytes viewed as int8), 34 bytes per 32 numbers: the float16
  scale's two bytes, then 32 quants (engine/memory/kv_types.py). A block's quants are scaled once, after their
  dot product (keys) or folded into the weight of the row (values).

Quantizing follows ggml's reference (engine/memory/kv_types.py: `quantize_q8_0_reference`) bit for bit: it is
compiled without fastmath, whose "arcp" would turn amax / 127 into a multiply (a one-ulp change that
flips roundings, measured in engine/cpu/matmul/tiles.py).

Numba's cache checks the timestamp of a kernel's own file only: after editing this module, clear the
JIT cache (`rm -rf ~/.cache/llamba/numba`) or the attention kernels keep the old reads.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from engine.cpu.f16 import float_to_half, half_to_float
from engine.cpu.lanes import LANES, ORDERED, lane_total, zero_lanes
from engine.memory.kv_types import Q8_0_BLOCK_BYTES, QK8_0

_FAST = {"fastmath": ORDERED, "error_model": "numpy"}
_KERNEL = {"cache": True, "nogil": True, **_FAST}
_EXACT = {"cache": True, "nogil": True, "error_model": "numpy"}
F0 = np.float32(0.0)


def as_kernel_cells(cache: np.ndarray) -> np.ndarray:
    """The view the kernels take of a cache array: float16 as uint16 bits, Q8_0 bytes as int8."""
    return cache.view(np.uint16) if cache.dtype == np.float16 else cache.view(np.int8)


# ---------------------------------------------------------------------------------------------------
# Q8_0 rows


@njit(inline="always", **_KERNEL)
def _q8_scale(row: np.ndarray, o: int) -> np.float32:
    """The float16 scale whose two little-endian bytes start at row[o]."""
    lo = np.uint16(np.uint8(row[o]))
    hi = np.uint16(np.uint8(row[o + 1]))
    return half_to_float(np.uint16(lo | (hi << np.uint16(8))))


@njit(**_EXACT)
def _roundf(x: np.float32) -> np.float32:
    """C's roundf: to nearest, ties away from zero."""
    t = np.float32(math.trunc(x))
    if abs(x - t) >= np.float32(0.5):
        t += np.float32(math.copysign(1.0, x))
    return t


@njit(**_EXACT)
def quantize_q8_0_row(x: np.ndarray, out: np.ndarray) -> None:
    """x[head_dim] (float32) -> out[head_dim / 32 * 34] Q8_0 bytes (int8 view): ggml's reference rule."""
    for b in range(x.shape[0] // QK8_0):
        amax = F0
        for i in range(QK8_0):
            amax = max(amax, abs(np.float32(x[b * QK8_0 + i])))
        d = amax / np.float32(127.0)
        inv = np.float32(1.0) / d if d != F0 else F0
        o = b * Q8_0_BLOCK_BYTES
        bits = float_to_half(d)
        out[o] = np.int8(np.uint8(bits & np.uint16(0xFF)))
        out[o + 1] = np.int8(np.uint8(bits >> np.uint16(8)))
        for i in range(QK8_0):
            out[o + 2 + i] = np.int8(_roundf(np.float32(x[b * QK8_0 + i]) * inv))


@njit(**_KERNEL)
def dequantize_q8_0_row(row: np.ndarray, out: np.ndarray) -> None:
    """Q8_0 bytes row (int8 view) -> out[head_dim] float32."""
    for b in range(out.shape[0] // QK8_0):
        o = b * Q8_0_BLOCK_BYTES
        d = _q8_scale(row, o)
        for i in range(QK8_0):
            out[b * QK8_0 + i] = d * np.float32(row[o + 2 + i])


# ---------------------------------------------------------------------------------------------------
# Typed entry points the attention kernels call (stubs: `overload` gives each cell type its body).


def store_row(x: np.ndarray, cells: np.ndarray, s: int, h: int, p: int) -> None:
    """cells[s, h, p] = x[head_dim] in the cells' type."""


def dot4(q: np.ndarray, cells: np.ndarray, c: int) -> tuple[float, float, float, float]:
    """q . cells[c + k] for k = 0..3."""
    return (0.0, 0.0, 0.0, 0.0)


def dot1(q: np.ndarray, cells: np.ndarray, c: int) -> float:
    """q . cells[c]."""
    return 0.0


def add_rows4(out: np.ndarray, p: np.ndarray, cells: np.ndarray, c: int) -> None:
    """out += sum_k p[k] * cells[c + k] for k = 0..3."""


def add_row1(out: np.ndarray, p: float, cells: np.ndarray, c: int) -> None:
    """out += p * cells[c]."""


def _is_f16(cells: types.Array) -> bool:
    return cells.dtype == types.uint16


def _is_q8(cells: types.Array) -> bool:
    return cells.dtype == types.int8


@overload(store_row, inline="always", jit_options=_FAST)
def _store_row(x, cells, s, h, p):  # type: ignore[no-untyped-def]
    if _is_f16(cells):

        def f16(x, cells, s, h, p):  # type: ignore[no-untyped-def]
            for i in range(x.shape[0]):
                cells[s, h, p, i] = float_to_half(x[i])

        return f16
    if _is_q8(cells):

        def q8(x, cells, s, h, p):  # type: ignore[no-untyped-def]
            quantize_q8_0_row(x, cells[s, h, p])

        return q8
    return None


@njit(inline="always", **_KERNEL)
def _add_products4(acc: np.ndarray, lane: int, q: np.ndarray, cells: np.ndarray, c: int, i: int) -> None:
    """Lane `lane` of four f16 sums: += q[i] * cells[c + k, i] for k = 0..3."""
    qi = q[i]
    acc[0, lane] += qi * half_to_float(cells[c, i])
    acc[1, lane] += qi * half_to_float(cells[c + 1, i])
    acc[2, lane] += qi * half_to_float(cells[c + 2, i])
    acc[3, lane] += qi * half_to_float(cells[c + 3, i])


@overload(dot4, inline="always", jit_options=_FAST)
def _dot4(q, cells, c):  # type: ignore[no-untyped-def]
    if _is_f16(cells):

        def f16(q, cells, c):  # type: ignore[no-untyped-def]
            acc = zero_lanes()
            dim = q.shape[0]
            body = dim - dim % LANES
            for i0 in range(0, body, LANES):
                for lane in range(LANES):
                    _add_products4(acc, lane, q, cells, c, i0 + lane)
            for i in range(body, dim):  # a head_dim that is no multiple of LANES: the rest, one a lane
                _add_products4(acc, i - body, q, cells, c, i)
            return lane_total(acc[0]), lane_total(acc[1]), lane_total(acc[2]), lane_total(acc[3])

        return f16
    if _is_q8(cells):

        def q8(q, cells, c):  # type: ignore[no-untyped-def]
            acc = zero_lanes()
            for b in range(q.shape[0] // QK8_0):
                o = b * Q8_0_BLOCK_BYTES
                for k in range(4):
                    d = _q8_scale(cells[c + k], o)
                    for lane in range(LANES):  # a block's 32 quants: two per lane
                        i = b * QK8_0 + lane
                        pair = q[i] * np.float32(cells[c + k, o + 2 + lane]) + q[i + LANES] * np.float32(
                            cells[c + k, o + 2 + LANES + lane]
                        )
                        acc[k, lane] += pair * d
            return lane_total(acc[0]), lane_total(acc[1]), lane_total(acc[2]), lane_total(acc[3])

        return q8
    return None


@overload(dot1, inline="always", jit_options=_FAST)
def _dot1(q, cells, c):  # type: ignore[no-untyped-def]
    if _is_f16(cells):

        def f16(q, cells, c):  # type: ignore[no-untyped-def]
            acc = zero_lanes()
            dim = q.shape[0]
            body = dim - dim % LANES
            for i0 in range(0, body, LANES):
                for lane in range(LANES):
                    acc[0, lane] += q[i0 + lane] * half_to_float(cells[c, i0 + lane])
            for i in range(body, dim):
                acc[0, i - body] += q[i] * half_to_float(cells[c, i])
            return lane_total(acc[0])

        return f16
    if _is_q8(cells):

        def q8(q, cells, c):  # type: ignore[no-untyped-def]
            acc = zero_lanes()
            for b in range(q.shape[0] // QK8_0):
                o = b * Q8_0_BLOCK_BYTES
                d = _q8_scale(cells[c], o)
                for lane in range(LANES):
                    i = b * QK8_0 + lane
                    pair = q[i] * np.float32(cells[c, o + 2 + lane]) + q[i + LANES] * np.float32(
                        cells[c, o + 2 + LANES + lane]
                    )
                    acc[0, lane] += pair * d
            return lane_total(acc[0])

        return q8
    return None


@overload(add_rows4, inline="always", jit_options=_FAST)
def _add_rows4(out, p, cells, c):  # type: ignore[no-untyped-def]
    if _is_f16(cells):

        def f16(out, p, cells, c):  # type: ignore[no-untyped-def]
            p0, p1, p2, p3 = p[0], p[1], p[2], p[3]
            for i in range(out.shape[0]):
                out[i] += (
                    p0 * half_to_float(cells[c, i])
                    + p1 * half_to_float(cells[c + 1, i])
                    + p2 * half_to_float(cells[c + 2, i])
                    + p3 * half_to_float(cells[c + 3, i])
                )

        return f16
    if _is_q8(cells):

        def q8(out, p, cells, c):  # type: ignore[no-untyped-def]
            for b in range(out.shape[0] // QK8_0):
                o = b * Q8_0_BLOCK_BYTES
                w0 = p[0] * _q8_scale(cells[c], o)
                w1 = p[1] * _q8_scale(cells[c + 1], o)
                w2 = p[2] * _q8_scale(cells[c + 2], o)
                w3 = p[3] * _q8_scale(cells[c + 3], o)
                for i in range(QK8_0):
                    out[b * QK8_0 + i] += (
                        w0 * np.float32(cells[c, o + 2 + i])
                        + w1 * np.float32(cells[c + 1, o + 2 + i])
                        + w2 * np.float32(cells[c + 2, o + 2 + i])
                        + w3 * np.float32(cells[c + 3, o + 2 + i])
                    )

        return q8
    return None


@overload(add_row1, inline="always", jit_options=_FAST)
def _add_row1(out, p, cells, c):  # type: ignore[no-untyped-def]
    if _is_f16(cells):

        def f16(out, p, cells, c):  # type: ignore[no-untyped-def]
            for i in range(out.shape[0]):
                out[i] += p * half_to_float(cells[c, i])

        return f16
    if _is_q8(cells):

        def q8(out, p, cells, c):  # type: ignore[no-untyped-def]
            for b in range(out.shape[0] // QK8_0):
                o = b * Q8_0_BLOCK_BYTES
                w = p * _q8_scale(cells[c], o)
                for i in range(QK8_0):
                    out[b * QK8_0 + i] += w * np.float32(cells[c, o + 2 + i])

        return q8
    return None


# ---------------------------------------------------------------------------------------------------
# Whole rows for a context shift: keys are staged as float32, rotated, and stored back.


@njit(parallel=True, **_KERNEL)
def gather_q8_0(cells: np.ndarray, start: int, out: np.ndarray) -> None:
    """out[n, heads, head_dim] = the float32 numbers of Q8_0 cells[heads, n_ctx, row] from `start`."""
    n, heads, _ = out.shape
    for job in prange(n * heads):
        t, h = job // heads, job % heads
        dequantize_q8_0_row(cells[h, start + t], out[t, h])


@njit(parallel=True, **_EXACT)
def scatter_q8_0(x: np.ndarray, cells: np.ndarray, start: int) -> None:
    """Q8_0 cells[heads, start + t] = x[t, heads, head_dim], quantized as the store quantizes."""
    n, heads, _ = x.shape
    for job in prange(n * heads):
        t, h = job // heads, job % heads
        quantize_q8_0_row(x[t, h], cells[h, start + t])
