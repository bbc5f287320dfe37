"""The Q4_0 and Q4_1 matmul kernels (int16 tiles and byte dot-product tiles)."""

from __future__ import annotations

import numpy as np
from numba import carray, njit, prange

from engine.cpu.matmul.activations import ACT_Q8_1, _activation_quads, _quantize
from engine.cpu.matmul.intrinsics import PREFETCH_BYTES, _prefetch, _quad_sums1, _quad_sums2, _quad_sums4
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

# The scale/min rule of the 4-bit tiles; each kind has its own kernel with the kind as a constant.
KIND_Q4_0, KIND_Q4_1, KIND_Q4_K = 0, 1, 2


# 4-bit: Q4_0, Q4_1, Q4_K. Block b, position j: byte qs[g, (b*16 + j)*32 + r] holds weights j, j + 16.
# Half a block (8 positions x 2 nibbles) is 16 products of at most 15 * 127 per lane: fits int16.


@njit(inline="always")
def _q4_add_half(acc, s16, d, g, b, xd, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """acc += d * xd * s16 for half a block (Q4_0, Q4_1; Q4_K scales per super-block: _k_superblock)."""
    dq = _lanes(d, g, b)
    for t in range(n_tok):
        xdt = xd[t0 + t, b]
        for r in range(ROWS):
            acc[t, r] += f16_to_f32(dq[r]) * xdt * np.float32(s16[t, r])


@njit(inline="always")
def _q4_add_min(acc, d, m, kind, g, b, xs, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """acc += (block minimum) * sum(x of the block): -8d for Q4_0, m for Q4_1."""
    if kind == KIND_Q4_0:
        dq = _lanes(d, g, b)
        for t in range(n_tok):
            xst = xs[t0 + t, b]
            for r in range(ROWS):
                acc[t, r] -= np.float32(8.0) * f16_to_f32(dq[r]) * xst
    else:
        mq = _lanes(m, g, b)
        for t in range(n_tok):
            xst = xs[t0 + t, b]
            for r in range(ROWS):
                acc[t, r] += f16_to_f32(mq[r]) * xst


@njit(inline="always")
def _q4_tile(a, g, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    qs, d, m, sc, mn, kind, xq, xd, xs, out = a
    acc = stack_tile_f32()
    s16 = stack_tile_i16()
    _zero_tile(acc, n_tok)
    for b in range(xd.shape[1]):
        for half in range(2):
            _zero_tile(s16, n_tok)
            for jj in range(8):
                j = half * 8 + jj
                wq = _lanes(qs, g, b * 16 + j)
                for t in range(n_tok):
                    xlo = xq[t0 + t, b * QK + j]
                    xhi = xq[t0 + t, b * QK + j + 16]
                    for r in range(ROWS):
                        v = wq[r]
                        s16[t, r] += np.int16(v & 15) * xlo + np.int16(v >> 4) * xhi
            _q4_add_half(acc, s16, d, g, b, xd, t0, n_tok)
        _q4_add_min(acc, d, m, kind, g, b, xs, t0, n_tok)
    _store_tile(acc, out, np.int64(g), np.int64(t0), n_tok)


# The VNNI twin of _q4_tile: every tile size on vpdpbusd (_quad_sums: 4 unsigned weight bytes of a row
# times 4 int8 activations per lane). Its integer sums are the int16 path's half-block sums exactly,
# scaled the same way, so a token's output does not depend on its tile. Tiles of 4 and 8 tokens ran
# vpdpwssd on int16 nibble pairs before: twice the multiplies; vpdpbusd made Q4_K prefill 1.7-2.5x faster
# (17920x1536 and 1536x8960 at T = 512, 2 threads: 208 / 145 -> 362 / 362 GFLOP/s).


@njit(inline="always")
def _q4_tile_vnni(a, g, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    qs, d, m, sc, mn, kind, xb, xd, xs, out = a
    acc = stack_tile_f32()
    sums_ptr = _alloca_i32(256)
    sums = carray(sums_ptr, (8, 32))
    flat_sums = carray(sums_ptr, (256,))
    qs_g = qs[g]
    _zero_tile(acc, n_tok)
    for b in range(xd.shape[1]):
        for half in range(2):
            first = (b * 16 + half * 8) * ROWS
            if n_tok <= 2:
                for line in range(4):
                    _prefetch(qs_g, first + PREFETCH_BYTES + 64 * line)
            if n_tok == 8:
                _quad_sums4(flat_sums, qs_g, first, xb, t0, b * 8 + half * 2)
                _quad_sums4(flat_sums[128:], qs_g, first, xb, t0 + 4, b * 8 + half * 2)
            elif n_tok == 4:
                _quad_sums4(flat_sums, qs_g, first, xb, t0, b * 8 + half * 2)
            elif n_tok == 2:
                _quad_sums2(flat_sums, qs_g, first, xb, t0, b * 8 + half * 2)
            else:
                _quad_sums1(flat_sums, qs_g, first, xb, t0, b * 8 + half * 2)
            _q4_add_half(acc, sums, d, g, b, xd, t0, n_tok)
        _q4_add_min(acc, d, m, kind, g, b, xs, t0, n_tok)
    _store_tile(acc, out, np.int64(g), np.int64(t0), n_tok)


@njit(parallel=True, **_KERNEL)
def _matmul_q4_0_vnni(x, qs, d, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, xs = _quantize(x)
    xb = _activation_quads(xq)
    a_vnni = (qs, d, d, d, d, KIND_Q4_0, xb, xd, xs, out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _q4_tile_vnni, a_vnni, _q4_tile_vnni, a_vnni, g)


@njit(parallel=True, **_KERNEL)
def _matmul_q4_1_vnni(x, qs, d, m, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, xs = _quantize(x, ACT_Q8_1)
    xb = _activation_quads(xq)
    a_vnni = (qs, d, m, d, d, KIND_Q4_1, xb, xd, xs, out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _q4_tile_vnni, a_vnni, _q4_tile_vnni, a_vnni, g)


# One kernel per kind, so the kind is a constant in the tiles (a runtime kind halved Q4_K's speed at
# T = 1), and each compiles only when a model uses it.


@njit(parallel=True, **_KERNEL)
def _matmul_q4_0(x, qs, d, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, xs = _quantize(x)
    a = (qs, d, d, d, d, KIND_Q4_0, xq, xd, xs, out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _q4_tile, a, _q4_tile, a, g)


@njit(parallel=True, **_KERNEL)
def _matmul_q4_1(x, qs, d, m, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, xs = _quantize(x, ACT_Q8_1)
    a = (qs, d, m, d, d, KIND_Q4_1, xq, xd, xs, out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _q4_tile, a, _q4_tile, a, g)
