"""The Q5_0 and Q5_1 matmul kernels (int16 tiles and byte dot-product tiles)."""

from __future__ import annotations

import numpy as np
from numba import carray, njit, prange

from engine.cpu.matmul.activations import ACT_Q8_1, _activation_quads, _half_block_sums, _quantize
from engine.cpu.matmul.intrinsics import _q5_half_sums1, _q5_half_sums2, _q5_half_sums4
from engine.cpu.matmul.q4 import _q4_add_half
from engine.cpu.matmul.tiles import (
    _KERNEL,
    _alloca_i32,
    _each_tile,
    _lanes,
    _store_tile,
    _zero_tile,
    f16_to_f32,
    stack_tile_f32,
    stack_tile_i16,
)
from engine.quant import QK, ROWS

# Q5_0: low nibbles as the 4-bit layout; fifth bits of positions (j, j + 16) in qh byte j // 4 of the
# block, bits 2 * (j % 4) and 2 * (j % 4) + 1. Weights are q - 16: half a block is 16 products of at
# most 16 * 127 per lane, which fits int16.


@njit(inline="always")
def _q5_position(s16, qs, wh, shift, xq, g, b, j, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """s16 += weights (j, j + 16) of block b times their activations. Callers pass `shift` as a
    literal: with a variable shift LLVM cannot narrow the lanes and computes in int64 (4x slower)."""
    wq = _lanes(qs, g, b * 16 + j)
    for t in range(n_tok):
        xlo = xq[t0 + t, b * QK + j]
        xhi = xq[t0 + t, b * QK + j + 16]
        for r in range(ROWS):
            v = wq[r]
            h = wh[r] >> shift
            lo = np.int16((v & 15) | ((h & 1) << 4)) - np.int16(16)
            hi = np.int16((v >> 4) | ((h & 2) << 3)) - np.int16(16)
            s16[t, r] += lo * xlo + hi * xhi


@njit(inline="always")
def _q5_tile(a, g, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """Q5_0, and Q5_1 when `with_min`: its w = d*q + m summed as d*(q - 16) + (16*d*sum(x) + m*s),
    with llama.cpp's q8_1 terms (sum(x) from the stored d, s = d * sum(q) rounded to f16)."""
    qs, qh, d, m, with_min, xq, xd, xs, xsum, out = a
    acc = stack_tile_f32()
    s16 = stack_tile_i16()
    _zero_tile(acc, n_tok)
    for b in range(xd.shape[1]):
        dq = _lanes(d, g, b)
        for half in range(2):
            _zero_tile(s16, n_tok)
            for c in range(2 * half, 2 * half + 2):
                wh = _lanes(qh, g, b * 4 + c)
                _q5_position(s16, qs, wh, 0, xq, g, b, 4 * c, t0, n_tok)
                _q5_position(s16, qs, wh, 2, xq, g, b, 4 * c + 1, t0, n_tok)
                _q5_position(s16, qs, wh, 4, xq, g, b, 4 * c + 2, t0, n_tok)
                _q5_position(s16, qs, wh, 6, xq, g, b, 4 * c + 3, t0, n_tok)
            for t in range(n_tok):
                xdt = xd[t0 + t, b]
                for r in range(ROWS):
                    acc[t, r] += f16_to_f32(dq[r]) * xdt * np.float32(s16[t, r])
        if with_min:
            mq = _lanes(m, g, b)
            for t in range(n_tok):
                xst, xsumt = xs[t0 + t, b], xsum[t0 + t, b]
                for r in range(ROWS):
                    acc[t, r] += np.float32(16.0) * f16_to_f32(dq[r]) * xsumt + f16_to_f32(mq[r]) * xst
    _store_tile(acc, out, np.int64(g), np.int64(t0), n_tok)


@njit(parallel=True, **_KERNEL)
def _matmul_q5(x, qs, qh, d, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, xs = _quantize(x)
    a = (qs, qh, d, d, False, xq, xd, xs, xs, out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _q5_tile, a, _q5_tile, a, g)


@njit(**_KERNEL)
def _integer_sums(xq: np.ndarray, xd: np.ndarray) -> np.ndarray:
    """d * sum(q) per 32-block with the stored d (q8_0's sum; q8_1's own sum is rounded to f16)."""
    n_tok, nb = xd.shape
    out = np.empty((n_tok, nb), np.float32)
    for t in range(n_tok):
        for b in range(nb):
            total = 0
            for i in range(QK):
                total += np.int32(xq[t, b * QK + i])
            out[t, b] = xd[t, b] * np.float32(total)
    return out


@njit(parallel=True, **_KERNEL)
def _matmul_q5_1(x, qs, qh, d, m, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, xs = _quantize(x, ACT_Q8_1)
    a = (qs, qh, d, m, True, xq, xd, xs, _integer_sums(xq, xd), out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _q5_tile, a, _q5_tile, a, g)


@njit(inline="always")
def _q5_tile_vnni(a, g, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """_q5_tile on vpdpbusd (_q5_half_sums: the same centred half-block sums), the same float steps."""
    qs, qh, d, m, with_min, xb, x16h, xd, xs, xsum, out = a
    acc = stack_tile_f32()
    sums_ptr = _alloca_i32(256)
    sums, flat_sums = carray(sums_ptr, (8, 32)), carray(sums_ptr, (256,))
    qs_g, qh_g = qs[g], qh[g]
    _zero_tile(acc, n_tok)
    for b in range(xd.shape[1]):
        for half in range(2):
            at, qh_at, col, h = (
                (b * 16 + half * 8) * ROWS,
                (b * 4 + half * 2) * ROWS,
                b * 8 + half * 2,
                2 * b + half,
            )
            if n_tok == 8:
                _q5_half_sums4(flat_sums, qs_g, at, qh_g, qh_at, xb, t0, col, x16h, h)
                _q5_half_sums4(flat_sums[128:], qs_g, at, qh_g, qh_at, xb, t0 + 4, col, x16h, h)
            elif n_tok == 4:
                _q5_half_sums4(flat_sums, qs_g, at, qh_g, qh_at, xb, t0, col, x16h, h)
            elif n_tok == 2:
                _q5_half_sums2(flat_sums, qs_g, at, qh_g, qh_at, xb, t0, col, x16h, h)
            else:
                _q5_half_sums1(flat_sums, qs_g, at, qh_g, qh_at, xb, t0, col, x16h, h)
            _q4_add_half(acc, sums, d, g, b, xd, t0, n_tok)
        if with_min:
            dq, mq = _lanes(d, g, b), _lanes(m, g, b)
            for t in range(n_tok):
                xst, xsumt = xs[t0 + t, b], xsum[t0 + t, b]
                for r in range(ROWS):
                    acc[t, r] += np.float32(16.0) * f16_to_f32(dq[r]) * xsumt + f16_to_f32(mq[r]) * xst
    _store_tile(acc, out, np.int64(g), np.int64(t0), n_tok)


@njit(parallel=True, **_KERNEL)
def _matmul_q5_vnni(x, qs, qh, d, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, xs = _quantize(x)
    a = (qs, qh, d, d, False, _activation_quads(xq), _half_block_sums(xq), xd, xs, xs, out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _q5_tile_vnni, a, _q5_tile_vnni, a, g)


@njit(parallel=True, **_KERNEL)
def _matmul_q5_1_vnni(x, qs, qh, d, m, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, xs = _quantize(x, ACT_Q8_1)
    a = (qs, qh, d, m, True, _activation_quads(xq), _half_block_sums(xq), xd, xs, _integer_sums(xq, xd), out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _q5_tile_vnni, a, _q5_tile_vnni, a, g)
