"""Quantized matrix multiplication and embedding lookup on CUDA: out[T, N] = x[T, K] @ W.T.

Weights are packed by engine.quant.pack_weight (the CPU layout: groups of 32 rows, every field
row-interleaved) and uploaded once; they stay quantized on the device and are dequantized in the kernel.
The interleaved layout suits a GPU as it is: lane r of a warp takes row r of the group, so the 32 lanes
read 32 consecutive bytes of the same weight position (coalesced), and f16 scales are read as float16.

A block per (row group, tile of tokens): threadIdx.x is the row lane, threadIdx.y one of `splits`
slices of the K axis (32-blocks taken round-robin). For each 32-block the block stages the activations
of its tokens in shared memory (coalesced loads, then broadcast reads), each thread dequantizes its
row's weights once and multiplies them into `tile` per-token sums kept in registers, and at the end the
slices' partial sums are added through shared memory. Decode (T = 1) uses a one-token tile and more
slices, so no work is spent on absent tokens; batches use 8-token tiles.

Unlike the CPU kernels, activations are not quantized to int8: the GPU has the float throughput, and
the result is closer to the exact product (the parity tests allow for the CPU's q8 rounding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import cuda, float32, int32

from engine import quant
from engine.cuda.arrays import blocks, device, ids, write_back
from engine.quant import IQ4_LEVELS, ROWS, QType

(KIND_Q4_0, KIND_Q4_1, KIND_Q4_K, KIND_Q5_0, KIND_Q6_K, KIND_Q8_0, KIND_FLOAT) = range(7)
KIND_Q5_K, KIND_Q5_1, KIND_IQ4_NL, KIND_IQ4_XS, KIND_Q3_K, KIND_Q2_K = range(7, 13)
KINDS = {
    QType.Q4_0: KIND_Q4_0,
    QType.Q4_1: KIND_Q4_1,
    QType.Q4_K: KIND_Q4_K,
    QType.Q5_0: KIND_Q5_0,
    QType.Q5_K: KIND_Q5_K,
    QType.Q5_1: KIND_Q5_1,
    QType.IQ4_NL: KIND_IQ4_NL,
    QType.IQ4_XS: KIND_IQ4_XS,
    QType.Q3_K: KIND_Q3_K,
    QType.Q2_K: KIND_Q2_K,
    QType.Q6_K: KIND_Q6_K,
    QType.Q8_0: KIND_Q8_0,
    QType.F32: KIND_FLOAT,
    QType.F16: KIND_FLOAT,
    QType.BF16: KIND_FLOAT,
}
TILES = (1, 8)  # tokens per block: decode, batches
MAX_SPLITS = 8  # the most K slices of a block (blockDim.y)
SPLITS = {1: 8, 8: 4}  # K slices per tile size: 256 threads for decode, 128 for batches
ROWS_THREADS = 128  # threads per row of get_rows


@dataclass(frozen=True)
class DeviceWeight:
    """A PackedWeight uploaded: the same fields as device arrays, f16 fields typed float16.

    Fields a format does not use hold a (1, 1) placeholder, so every kernel sees 2-D arrays.
    """

    qtype: int
    kind: int
    n_rows: int
    n_cols: int
    qs: Any
    qh: Any
    d: Any
    m: Any
    sc: Any
    mn: Any
    f: Any
    nbytes: int

    @property
    def n_groups(self) -> int:
        return -(-self.n_rows // ROWS)


def _field(a: np.ndarray, f16: bool = False) -> Any:
    if a.size == 0:
        a = np.zeros((1, 1), a.dtype)
    return cuda.to_device(a.view(np.float16) if f16 else a)


def upload(pw: quant.PackedWeight) -> DeviceWeight:
    """Copy a packed weight to the device (f16 bit fields reinterpreted as float16, no conversion).

    BF16 is widened to float32 here (twice its bytes on the device): numba.cuda has no bf16 type, and
    a kernel that shifts the bits is not written yet."""
    qt = QType(pw.qtype)
    f = pw.f if qt != QType.BF16 else (pw.f.astype(np.int32) << 16).view(np.float32)
    return DeviceWeight(
        qtype=int(qt),
        kind=KINDS[qt],
        n_rows=pw.n_rows,
        n_cols=pw.n_cols,
        qs=_field(pw.qs),
        qh=_field(pw.qh),
        d=_field(pw.d, f16=True),
        m=_field(pw.m, f16=True),
        sc=_field(pw.sc),
        mn=_field(pw.mn),
        f=_field(f, f16=qt == QType.F16),
        nbytes=pw.nbytes,
    )


def pack_weight(data: np.ndarray, qtype: int, shape: tuple[int, int]) -> DeviceWeight:
    """The backend's pack_weight: repack on the host once, upload once, keep only the device copy."""
    return upload(quant.pack_weight(data, qtype, shape))


# ---------------------------------------------------------------------------------------------------
# Decoding one 32-block of one row (lane r of group g). `kind` is a compile-time constant in every
# kernel (a closure value), so the branches fold away.


@cuda.jit(device=True)
def block_params(kind, d, m, sc, mn, g, b, r):  # type: ignore[no-untyped-def]
    """(scale, low) of weights 0..15 and of weights 16..31 of block b: w = scale * q + low."""
    if kind == KIND_Q4_0:
        s = float32(d[g, b * 32 + r])
        return s, float32(-8.0) * s, s, float32(-8.0) * s
    if kind in (KIND_Q4_1, KIND_Q5_1):
        s = float32(d[g, b * 32 + r])
        low = float32(m[g, b * 32 + r])
        return s, low, s, low
    if kind in (KIND_Q4_K, KIND_Q5_K):
        s = float32(d[g, (b >> 3) * 32 + r]) * float32(sc[g, b * 32 + r])
        low = -float32(m[g, (b >> 3) * 32 + r]) * float32(mn[g, b * 32 + r])
        return s, low, s, low
    if kind == KIND_Q5_0:
        s = float32(d[g, b * 32 + r])
        return s, float32(-16.0) * s, s, float32(-16.0) * s
    if kind == KIND_IQ4_NL:
        s = float32(d[g, b * 32 + r])
        return s, float32(0.0), s, float32(0.0)
    if kind == KIND_IQ4_XS:
        s = float32(d[g, (b >> 3) * 32 + r]) * float32(sc[g, b * 32 + r])
        return s, float32(0.0), s, float32(0.0)
    # Q6_K, Q3_K (quants stored + 32, + 4) and Q2_K (a min): one scale per 16 weights
    ds = float32(d[g, (b >> 3) * 32 + r])
    s_lo = ds * float32(sc[g, (2 * b) * 32 + r])
    s_hi = ds * float32(sc[g, (2 * b + 1) * 32 + r])
    if kind == KIND_Q2_K:
        dm = float32(m[g, (b >> 3) * 32 + r])
        return s_lo, -dm * float32(mn[g, (2 * b) * 32 + r]), s_hi, -dm * float32(mn[g, (2 * b + 1) * 32 + r])
    offset = float32(-4.0) if kind == KIND_Q3_K else float32(-32.0)
    return s_lo, offset * s_lo, s_hi, offset * s_hi


@cuda.jit(device=True)
def quants(kind, qs, qh, g, b, j, r):  # type: ignore[no-untyped-def]
    """The unsigned quants of weights j and j + 16 of block b (j < 16), as floats."""
    if kind in (KIND_Q2_K, KIND_Q3_K):  # two-bit crumbs: byte p holds weights p + 8k, k < 4
        p = j & 7
        k = j >> 3
        v = int32(qs[g, (b * 8 + p) * 32 + r])
        lo = (v >> (2 * k)) & 3
        hi = (v >> (2 * k + 4)) & 3
        if kind == KIND_Q3_K:
            h = int32(qh[g, (b * 4 + (p & 3)) * 32 + r]) >> (4 * (p >> 2))
            lo |= ((h >> k) & 1) << 2
            hi |= ((h >> (k + 2)) & 1) << 2
        return float32(lo), float32(hi)
    v = int32(qs[g, (b * 16 + j) * 32 + r])
    lo = v & 15
    hi = v >> 4
    if kind in (KIND_Q5_0, KIND_Q5_K, KIND_Q5_1):
        h = int32(qh[g, (b * 4 + (j >> 2)) * 32 + r]) >> (2 * (j & 3))
        lo |= (h & 1) << 4
        hi |= (h & 2) << 3
    elif kind in (KIND_IQ4_NL, KIND_IQ4_XS):
        return float32(IQ4_LEVELS[lo]), float32(IQ4_LEVELS[hi])
    elif kind == KIND_Q6_K:
        h = int32(qh[g, (b * 8 + (j >> 1)) * 32 + r]) >> (4 * (j & 1))
        lo |= (h & 3) << 4
        hi |= (h & 12) << 2
    return float32(lo), float32(hi)


# ---------------------------------------------------------------------------------------------------
# Kernels, made per (kind, tile) so both are constants: the tile sizes the register accumulators.


def _make_matmul(kind: int, tile: int):  # type: ignore[no-untyped-def]
    def matmul_kernel(x, qs, qh, d, m, sc, mn, f, out):  # type: ignore[no-untyped-def]
        xs = cuda.shared.array((MAX_SPLITS, tile, 32), float32)
        acc = cuda.local.array(tile, float32)
        n_groups = qs.shape[0] if kind != KIND_FLOAT else f.shape[0]
        n_tiles = (x.shape[0] + tile - 1) // tile
        for job in range(cuda.blockIdx.x, n_groups * n_tiles, cuda.gridDim.x):
            g = job % n_groups
            t0 = (job // n_groups) * tile
            _tile_sums(kind, tile, x, qs, qh, d, m, sc, mn, f, g, t0, xs, acc)
            _store_sums(tile, out, x.shape[0], g, t0, xs, acc)

    return matmul_kernel


@cuda.jit(device=True)
def _tile_sums(kind, tile, x, qs, qh, d, m, sc, mn, f, g, t0, xs, acc):  # type: ignore[no-untyped-def]
    """acc[t] = this thread's slice of the dot product of row lane r of group g with token t0 + t."""
    r = cuda.threadIdx.x
    s = cuda.threadIdx.y
    n_split = cuda.blockDim.y
    n_tok = x.shape[0]
    n_cols = x.shape[1]
    for t in range(tile):
        acc[t] = float32(0.0)
    for b0 in range(0, (n_cols + 31) // 32, n_split):
        b = b0 + s
        col = b * 32 + r
        for t in range(tile):
            inside = t0 + t < n_tok and col < n_cols
            xs[s, t, r] = x[t0 + t, col] if inside else float32(0.0)
        cuda.syncthreads()
        if b * 32 < n_cols:
            if kind == KIND_FLOAT:
                for k in range(min(32, n_cols - b * 32)):
                    w = float32(f[g, (b * 32 + k) * 32 + r])
                    for t in range(tile):
                        acc[t] += w * xs[s, t, k]
            elif kind == KIND_Q8_0:
                dv = float32(d[g, b * 32 + r])
                for k in range(32):
                    w = dv * float32(qs[g, (b * 32 + k) * 32 + r])
                    for t in range(tile):
                        acc[t] += w * xs[s, t, k]
            else:
                s_lo, l_lo, s_hi, l_hi = block_params(kind, d, m, sc, mn, g, b, r)
                for j in range(16):
                    q_lo, q_hi = quants(kind, qs, qh, g, b, j, r)
                    w_lo = s_lo * q_lo + l_lo
                    w_hi = s_hi * q_hi + l_hi
                    for t in range(tile):
                        acc[t] += w_lo * xs[s, t, j] + w_hi * xs[s, t, j + 16]
        cuda.syncthreads()


@cuda.jit(device=True)
def _store_sums(tile, out, n_tok, g, t0, xs, acc):  # type: ignore[no-untyped-def]
    """Add up the slices' partial sums through shared memory; slice s stores tokens s, s + n_split, ..."""
    r = cuda.threadIdx.x
    s = cuda.threadIdx.y
    n_split = cuda.blockDim.y
    for t in range(tile):
        xs[s, t, r] = acc[t]
    cuda.syncthreads()
    row = g * 32 + r
    for t in range(s, tile, n_split):
        if t0 + t < n_tok and row < out.shape[1]:
            total = float32(0.0)
            for k in range(n_split):
                total += xs[k, t, r]
            out[t0 + t, row] = total
    cuda.syncthreads()  # xs is refilled by the next job


def _make_get_rows(kind: int):  # type: ignore[no-untyped-def]
    def get_rows_kernel(row_ids, qs, qh, d, m, sc, mn, f, out):  # type: ignore[no-untyped-def]
        """A block per id: the row dequantized, each thread a share of its weights."""
        for i in range(cuda.blockIdx.x, row_ids.shape[0], cuda.gridDim.x):
            _dequant_row(kind, row_ids[i], qs, qh, d, m, sc, mn, f, out, i)

    return get_rows_kernel


@cuda.jit(device=True)
def _dequant_row(kind, row, qs, qh, d, m, sc, mn, f, out, i):  # type: ignore[no-untyped-def]
    g = row // 32
    r = row - g * 32
    n_cols = out.shape[1]
    if kind == KIND_FLOAT:
        for k in range(cuda.threadIdx.x, n_cols, cuda.blockDim.x):
            out[i, k] = float32(f[g, k * 32 + r])
    elif kind == KIND_Q8_0:
        for k in range(cuda.threadIdx.x, n_cols, cuda.blockDim.x):
            out[i, k] = float32(d[g, (k // 32) * 32 + r]) * float32(qs[g, k * 32 + r])
    else:
        for job in range(cuda.threadIdx.x, n_cols // 2, cuda.blockDim.x):
            b = job // 16
            j = job - b * 16
            s_lo, l_lo, s_hi, l_hi = block_params(kind, d, m, sc, mn, g, b, r)
            q_lo, q_hi = quants(kind, qs, qh, g, b, j, r)
            out[i, b * 32 + j] = s_lo * q_lo + l_lo
            out[i, b * 32 + j + 16] = s_hi * q_hi + l_hi


ALL_KINDS = tuple(range(13))  # every KIND_* above
MATMUL_PY = {(kind, tile): _make_matmul(kind, tile) for kind in ALL_KINDS for tile in TILES}
GET_ROWS_PY = {kind: _make_get_rows(kind) for kind in ALL_KINDS}
_MATMUL = {key: cuda.jit(fn) for key, fn in MATMUL_PY.items()}
_GET_ROWS = {kind: cuda.jit(fn) for kind, fn in GET_ROWS_PY.items()}


# ---------------------------------------------------------------------------------------------------
# Host entry points: engine.cpu.matmul's API.


def _fields(w: DeviceWeight) -> tuple[Any, ...]:
    return (w.qs, w.qh, w.d, w.m, w.sc, w.mn, w.f)


def matmul(x: Any, w: DeviceWeight, out: Any) -> None:
    """out[T, N] = x[T, K] @ W.T in float32."""
    n_tok = x.shape[0]
    if x.ndim != 2 or x.shape[1] != w.n_cols or tuple(out.shape) != (n_tok, w.n_rows):
        raise ValueError(f"matmul shapes: x {x.shape}, weight ({w.n_rows}, {w.n_cols}), out {out.shape}")
    dout = device(out)
    if n_tok:
        tile = TILES[0] if n_tok == 1 else TILES[1]
        jobs = w.n_groups * math.ceil(n_tok / tile)
        _MATMUL[(w.kind, tile)][blocks(jobs), (ROWS, SPLITS[tile])](device(x), *_fields(w), dout)
    write_back(out, dout)


def get_rows(w: DeviceWeight, row_ids: Any, out: Any) -> None:
    """Embedding lookup: out[i] = dequantized row ids[i] of W (out float32 (len(ids), K))."""
    if tuple(out.shape) != (len(row_ids), w.n_cols):
        raise ValueError(f"get_rows: out must be ({len(row_ids)}, {w.n_cols}), got {out.shape}")
    if isinstance(row_ids, np.ndarray) and row_ids.size and (row_ids.min() < 0 or row_ids.max() >= w.n_rows):
        raise IndexError(f"get_rows: ids out of range [0, {w.n_rows})")
    dout = device(out)
    if len(row_ids):
        _GET_ROWS[w.kind][blocks(len(row_ids)), ROWS_THREADS](ids(row_ids), *_fields(w), dout)
    write_back(out, dout)
