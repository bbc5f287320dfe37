"""The KV cache's cell types on CUDA: the twins of engine/cpu/kv_cells.py.

An f16 cache is a float16 device array; a q8_0 cache holds ggml's Q8_0 bytes as uint8 (34 per 32
numbers: a float16 scale, then 32 int8 quants; engine/memory/kv_types.py), the layout of the host copies.
numba.cuda has no bit casts the simulator also runs, so the scale's bits are decoded and encoded with
exact float arithmetic (ldexp/frexp on powers of two). Quantizing follows ggml's reference (and
llama.cpp's CUDA `quantize_f32_q8_0_block`): d = amax / 127, q = roundf(x * (1 / d)).

`load_f16`/`load_q8_0` read one number of a cell; the attention kernel is built once per pair of them
(engine/cuda/ops.py).
"""

from __future__ import annotations

import math

from numba import cuda, float32, int32
from numba.types import float16

QK = 32
BLOCK_BYTES = 34


@cuda.jit(device=True)
def half_from_bytes(lo, hi):  # type: ignore[no-untyped-def]
    """The float32 value of the float16 whose little-endian bytes are lo, hi (0..255)."""
    bits = int32(lo) | (int32(hi) << 8)
    e = (bits >> 10) & 0x1F
    m = bits & 0x3FF
    if e == 0:
        v = float32(math.ldexp(float32(m), -24))
    elif e == 31:
        v = float32(math.inf) if m == 0 else float32(math.nan)
    else:
        v = float32(math.ldexp(float32(1024 + m), int(e - 25)))
    return -v if bits & 0x8000 else v


@cuda.jit(device=True)
def half_bits(x):  # type: ignore[no-untyped-def]
    """The float16 bits of x >= 0 (a Q8_0 scale), rounded to nearest even as the hardware converts."""
    v = float32(float16(x))
    if v == float32(0.0):
        return int32(0)
    if math.isinf(v):
        return int32(0x7C00)
    mant, ex = math.frexp(v)  # v = mant * 2^ex, mant in [0.5, 1)
    e = ex + 14
    if e <= 0:  # subnormal: v = m * 2^-24
        return int32(math.ldexp(v, 24))
    return int32((e << 10) | int32(math.ldexp(mant, 11) - 1024))


@cuda.jit(device=True)
def signed(b):  # type: ignore[no-untyped-def]
    """An int8 quant from its byte 0..255."""
    x = int32(b)
    return x - ((x & 0x80) << 1)


@cuda.jit(device=True)
def load_f16(cache, s, h, j, i):  # type: ignore[no-untyped-def]
    return float32(cache[s, h, j, i])


@cuda.jit(device=True)
def load_q8_0(cache, s, h, j, i):  # type: ignore[no-untyped-def]
    b = i // QK
    o = b * BLOCK_BYTES
    d = half_from_bytes(cache[s, h, j, o], cache[s, h, j, o + 1])
    return d * float32(signed(cache[s, h, j, o + 2 + i - b * QK]))


@cuda.jit(device=True)
def roundf(x):  # type: ignore[no-untyped-def]
    """C's roundf: to nearest, ties away from zero (|x| <= 127 here: int32 truncates exactly)."""
    t = float32(int32(x))
    if abs(x - t) >= float32(0.5):
        t += float32(1.0) if x > 0 else float32(-1.0)
    return t


@cuda.jit(device=True)
def quantize_block(x, t, h, b, row):  # type: ignore[no-untyped-def]
    """Block b of x[t, h] (float32) into Q8_0 bytes row[b * 34 : (b + 1) * 34]."""
    amax = float32(0.0)
    for i in range(QK):
        amax = max(amax, abs(x[t, h, b * QK + i]))
    d = amax / float32(127.0)
    inv = float32(1.0) / d if d != float32(0.0) else float32(0.0)
    bits = half_bits(d)
    o = b * BLOCK_BYTES
    row[o] = bits & 0xFF
    row[o + 1] = (bits >> 8) & 0xFF
    for i in range(QK):
        q = int32(roundf(x[t, h, b * QK + i] * inv))
        row[o + 2 + i] = q & 0xFF


def _store_q8_0_py(x, seq_ids, positions, cache):  # type: ignore[no-untyped-def]
    """A block per token, a thread per (kv head, 32-block): x[T, n_kv, dim] -> Q8_0 cells [s, h, p]."""
    n_blocks = x.shape[2] // QK
    for t in range(cuda.blockIdx.x, x.shape[0], cuda.gridDim.x):
        for job in range(cuda.threadIdx.x, x.shape[1] * n_blocks, cuda.blockDim.x):
            h = job // n_blocks
            quantize_block(x, t, h, job - h * n_blocks, cache[seq_ids[t], h, positions[t]])


def _gather_q8_0_py(cells, start, out):  # type: ignore[no-untyped-def]
    """out[n, heads, dim] = the numbers of Q8_0 cells[heads, n_ctx, row] from `start`."""
    heads, dim = out.shape[1], out.shape[2]
    for e in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        t, h, i = e // (heads * dim), (e // dim) % heads, e % dim
        b = i // QK
        o = b * BLOCK_BYTES
        d = half_from_bytes(cells[h, start + t, o], cells[h, start + t, o + 1])
        out[t, h, i] = d * float32(signed(cells[h, start + t, o + 2 + i - b * QK]))


def _scatter_q8_0_py(x, cells, start):  # type: ignore[no-untyped-def]
    """Q8_0 cells[heads, start + t] = x[t, heads, dim] quantized; a thread per (token, head, 32-block)."""
    heads, n_blocks = x.shape[1], x.shape[2] // QK
    for e in range(cuda.grid(1), x.shape[0] * heads * n_blocks, cuda.gridsize(1)):
        t, h, b = e // (heads * n_blocks), (e // n_blocks) % heads, e % n_blocks
        quantize_block(x, t, h, b, cells[h, start + t])


store_q8_0 = cuda.jit(_store_q8_0_py)
gather_q8_0 = cuda.jit(_gather_q8_0_py)
scatter_q8_0 = cuda.jit(_scatter_q8_0_py)
