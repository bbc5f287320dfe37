"""The Q8_0 matmul kernels (int32 tiles and byte dot-product tiles)."""

from __future__ import annotations

import numpy as np
from numba import carray, njit, prange

from engine.cpu.matmul.activations import _activation_quads, _activation_sums32, _quantize
from engine.cpu.matmul.intrinsics import _q8_block_sums1, _q8_block_sums2, _q8_quad_sums4
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
from engine.cpu.simd import WORD_SUMS
from engine.quant import QK, ROWS

# Q8_0: int8 weights times int8 activations, as llama.cpp multiplies them (its vec_dot_type is q8_0),
# at every level and every tile size (so a token's output never depends on its batch): activations
# quantized per 32-block as for the other formats, int32 sums per block, then one scale per block.
# Portable: int32 lane loops. Byte-dot levels: tiles of 1 and 2 tokens pair adjacent positions into
# int16 lanes (vpdpwssd); of 4 and 8, 4 positions a lane (vpdpbusd). Until 2026-12-05 the portable
# kernel multiplied float weights by the unquantized activations: faster where it ran (the int16 path
# overflows with two int8 products), but Qwen2.5-0.5B's Q8_0 logits then drifted from llama.cpp's
# by 0.008-0.012 (tests/test_quant_models.py's bound is 1e-3).


@njit(inline="always")
def _q8_tile(a, g, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    qs, d, xq, xd, out = a
    acc = stack_tile_f32()
    sums = stack_tile_i32()
    _zero_tile(acc, n_tok)
    for b in range(xd.shape[1]):
        _zero_tile(sums, n_tok)
        for k in range(QK):
            wq = _lanes(qs, g, b * QK + k)
            for t in range(n_tok):
                xk = np.int32(xq[t0 + t, b * QK + k])
                for r in range(ROWS):
                    sums[t, r] += np.int32(wq[r]) * xk
        dq = _lanes(d, g, b)
        for t in range(n_tok):
            xdt = xd[t0 + t, b]
            for r in range(ROWS):
                acc[t, r] += f16_to_f32(dq[r]) * xdt * np.float32(sums[t, r])
    _store_tile(acc, out, np.int64(g), np.int64(t0), n_tok)


@njit(inline="always")
def _q8_tile_vnni(a, g, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    if n_tok == 8 and WORD_SUMS:
        # AVX2: two tiles of 4, each to its stores: 8 tokens' float sums (32 ymm) live in memory between
        # blocks. 1536 x 384, 256 tokens, one thread (2026-12-07, EPYC znver3): 29-31 GMAC/s in tiles
        # of 8, 39-41 in tiles of 4.
        _q8_tile_vnni_to(a, g, g, t0, 4)
        _q8_tile_vnni_to(a, g, g, t0 + 4, 4)
    else:
        _q8_tile_vnni_to(a, g, g, t0, n_tok)


@njit(inline="always")
def _q8_tile_vnni_to(a, g, go, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    qs, d, xp, xb, xs, xd, out = a
    acc = stack_tile_f32()
    sums = carray(_alloca_i32(256), (256,))
    qs_g = qs[g]
    _zero_tile(acc, n_tok)
    for b in range(xd.shape[1]):
        if n_tok == 8:
            _q8_quad_sums4(sums, qs_g, b * QK * ROWS, xb, xs, t0, b)
            _q8_quad_sums4(sums[4 * ROWS :], qs_g, b * QK * ROWS, xb, xs, t0 + 4, b)
        elif n_tok == 4:
            _q8_quad_sums4(sums, qs_g, b * QK * ROWS, xb, xs, t0, b)
        elif n_tok == 2:
            _q8_block_sums2(sums, qs_g, b * QK * ROWS, xp, t0, b * 16)
        else:
            _q8_block_sums1(sums, qs_g, b * QK * ROWS, xp, t0, b * 16)
        dq = _lanes(d, g, b)
        for t in range(n_tok):
            xdt = xd[t0 + t, b]
            for r in range(ROWS):
                acc[t, r] += f16_to_f32(dq[r]) * xdt * np.float32(sums[t * ROWS + r])
    _store_tile(acc, out, np.int64(go), np.int64(t0), n_tok)


@njit(**_KERNEL)
def _adjacent_pairs(xq: np.ndarray) -> np.ndarray:
    """int32 (x[2i], x[2i + 1]) of every row: low half x[2i], high half x[2i + 1]."""
    n_tok, k = xq.shape
    xp = np.empty((n_tok, k // 2), np.int32)
    for t in range(n_tok):
        for i in range(k // 2):
            xp[t, i] = (np.int32(xq[t, 2 * i]) & 0xFFFF) | (np.int32(xq[t, 2 * i + 1]) << 16)
    return xp


@njit(parallel=True, **_KERNEL)
def _matmul_q8_vnni(x, qs, d, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, _ = _quantize(x)
    a = (qs, d, _adjacent_pairs(xq), _activation_quads(xq), _activation_sums32(xq), xd, out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _q8_tile_vnni, a, _q8_tile_vnni, a, g)


@njit(parallel=True, **_KERNEL)
def _matmul_q8(x, qs, d, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, _ = _quantize(x)
    a = (qs, d, xq, xd, out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _q8_tile, a, _q8_tile, a, g)
