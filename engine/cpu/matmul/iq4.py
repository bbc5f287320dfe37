"""The IQ4_NL and IQ4_XS matmul kernels (int32 tiles and byte dot-product tiles)."""

from __future__ import annotations

import numpy as np
from numba import carray, njit, prange

from engine.cpu.matmul.activations import ACT_Q8_0, ACT_Q8_K, _activation_quads, _half_block_sums, _quantize
from engine.cpu.matmul.intrinsics import _iq4_quad_sums1, _iq4_quad_sums2, _iq4_quad_sums4
from engine.cpu.matmul.tiles import (
    _KERNEL,
    _alloca_i32,
    _each_tile,
    _lanes,
    _store_tile,
    _zero_tile,
    f16_to_f32,
    stack_tile_f32,
    stack_tile_i32,
)
from engine.quant import IQ4_LEVELS, QK, ROWS

# IQ4_NL and IQ4_XS: each nibble indexes IQ4_LEVELS (-127..113). Two level-times-int8 products are
# already 32258, so the sums of a block are int32. `per_sub_block` (IQ4_XS) scales each 32-block by
# d(super-block) * (ls - 32); IQ4_NL by its block's d.


@njit(inline="always")
def _iq4_tile(a, g, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    qs, d, sc, per_sub_block, xq, xd, out = a
    acc = stack_tile_f32()
    s32 = stack_tile_i32()
    _zero_tile(acc, n_tok)
    for b in range(xd.shape[1]):
        _zero_tile(s32, n_tok)
        for j in range(16):
            wq = _lanes(qs, g, b * 16 + j)
            for t in range(n_tok):
                xlo = np.int32(xq[t0 + t, b * QK + j])
                xhi = np.int32(xq[t0 + t, b * QK + j + 16])
                for r in range(ROWS):
                    v = wq[r]
                    s32[t, r] += np.int32(IQ4_LEVELS[v & 15]) * xlo + np.int32(IQ4_LEVELS[v >> 4]) * xhi
        _iq4_add_block(acc, s32, d, sc, per_sub_block, g, b, xd, t0, n_tok)
    _store_tile(acc, out, np.int64(g), np.int64(t0), n_tok)


@njit(inline="always")
def _iq4_add_block(acc, sums, d, sc, per_sub_block, g, b, xd, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """acc += the block's scale x xd x integer sums (of the block, or of half of it on the VNNI path)."""
    if per_sub_block:
        dq, scq = _lanes(d, g, b >> 3), _lanes(sc, g, b)
        for t in range(n_tok):
            xdt = xd[t0 + t, b]
            for r in range(ROWS):
                acc[t, r] += f16_to_f32(dq[r]) * np.float32(scq[r]) * xdt * np.float32(sums[t, r])
    else:
        dq = _lanes(d, g, b)
        for t in range(n_tok):
            xdt = xd[t0 + t, b]
            for r in range(ROWS):
                acc[t, r] += f16_to_f32(dq[r]) * xdt * np.float32(sums[t, r])


@njit(inline="always")
def _iq4_half_vnni(sums, qs_g, b, half, xb, xh, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """sums[t * 32 + r] = half `half` of block b's integer sum, for the tile's tokens."""
    at, col, h = (b * 16 + half * 8) * ROWS, b * 8 + half * 2, 2 * b + half
    if n_tok == 8:
        _iq4_quad_sums4(sums, qs_g, at, qs_g, 0, xb, t0, col, xh, h)
        _iq4_quad_sums4(sums[128:], qs_g, at, qs_g, 0, xb, t0 + 4, col, xh, h)
    elif n_tok == 4:
        _iq4_quad_sums4(sums, qs_g, at, qs_g, 0, xb, t0, col, xh, h)
    elif n_tok == 2:
        _iq4_quad_sums2(sums, qs_g, at, qs_g, 0, xb, t0, col, xh, h)
    else:
        _iq4_quad_sums1(sums, qs_g, at, qs_g, 0, xb, t0, col, xh, h)


@njit(inline="always")
def _iq4_tile_vnni(a, g, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """The VNNI IQ4 tile, every tile size: the levels + 128 looked up by vpshufb and summed on vpdpbusd,
    128 x the half's activation sum off (_centred_half_sums), scaled per half block (the portable tile
    scales per block: the same integers, float sums that differ in the last bits)."""
    qs, d, sc, per_sub_block, xb, xh, xd, out = a
    acc = stack_tile_f32()
    sums_ptr = _alloca_i32(256)
    sums, flat_sums = carray(sums_ptr, (8, 32)), carray(sums_ptr, (256,))
    qs_g = qs[g]
    _zero_tile(acc, n_tok)
    for b in range(xd.shape[1]):
        for half in range(2):
            _iq4_half_vnni(flat_sums, qs_g, b, half, xb, xh, t0, n_tok)
            _iq4_add_block(acc, sums, d, sc, per_sub_block, g, b, xd, t0, n_tok)
    _store_tile(acc, out, np.int64(g), np.int64(t0), n_tok)


@njit(parallel=True, **_KERNEL)
def _matmul_iq4_nl_vnni(x, qs, d, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, _ = _quantize(x, ACT_Q8_0)
    a = (qs, d, qs, False, _activation_quads(xq), _half_block_sums(xq), xd, out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _iq4_tile_vnni, a, _iq4_tile_vnni, a, g)


@njit(parallel=True, **_KERNEL)
def _matmul_iq4_xs_vnni(x, qs, d, sc, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, _ = _quantize(x, ACT_Q8_K)
    a = (qs, d, sc, True, _activation_quads(xq), _half_block_sums(xq), xd, out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _iq4_tile_vnni, a, _iq4_tile_vnni, a, g)


@njit(parallel=True, **_KERNEL)
def _matmul_iq4_nl(x, qs, d, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, _ = _quantize(x, ACT_Q8_0)
    a = (qs, d, qs, False, xq, xd, out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _iq4_tile, a, _iq4_tile, a, g)


@njit(parallel=True, **_KERNEL)
def _matmul_iq4_xs(x, qs, d, sc, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, _ = _quantize(x, ACT_Q8_K)
    a = (qs, d, sc, True, xq, xd, out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _iq4_tile, a, _iq4_tile, a, g)
