"""The Q5_K matmul kernels (int16 tiles and byte dot-product tiles)."""

from __future__ import annotations

import numpy as np
from numba import carray, njit, prange

from engine.cpu.matmul.activations import ACT_Q8_K, _activation_quads, _activation_sums32, _quantize
from engine.cpu.matmul.intrinsics import _q5k_block_sums1, _q5k_block_sums2, _q5k_block_sums4
from engine.cpu.matmul.q4k import _k_superblock
from engine.cpu.matmul.q5 import _q5_position
from engine.cpu.matmul.tiles import (
    _KERNEL,
    _alloca_i32,
    _each_tile,
    _lanes,
    _store_tile,
    _zero_tile,
    stack_tile_f32,
    stack_tile_i16,
)
from engine.quant import ROWS

# Q5_K: Q4_K's scales and mins with Q5_0's fifth bits, per 32-sub-block. The quants are summed as
# q - 16 (Q5_0's position code, so half a block fits int16), and w = d*sc*q - dmin*mn is rewritten as
# d*sc*(q - 16) + (16*d*sc - dmin*mn): the second term goes through the block's activation sum.


@njit(inline="always")
def _q5k_tile(a, g, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """Q5_K in Q4_K's integer order (_k_superblock): block b's sc x (sum of (q - 16) x + 16 sum(x))."""
    qs, qh, d, m, sc, mn, xq, xd, xsum, out = a
    acc = stack_tile_f32()
    s16 = stack_tile_i16()
    blocks = carray(_alloca_i32(2048), (8, 8, 32))
    _zero_tile(acc, n_tok)
    for sb in range(xd.shape[1] // 8):
        for bb in range(8):
            b = sb * 8 + bb
            scq = _lanes(sc, g, b)
            for half in range(2):
                _zero_tile(s16, n_tok)
                for c in range(2 * half, 2 * half + 2):
                    wh = _lanes(qh, g, b * 4 + c)
                    _q5_position(s16, qs, wh, 0, xq, g, b, 4 * c, t0, n_tok)
                    _q5_position(s16, qs, wh, 2, xq, g, b, 4 * c + 1, t0, n_tok)
                    _q5_position(s16, qs, wh, 4, xq, g, b, 4 * c + 2, t0, n_tok)
                    _q5_position(s16, qs, wh, 6, xq, g, b, 4 * c + 3, t0, n_tok)
                for t in range(n_tok):
                    offset = np.int32(16 * xsum[t0 + t, b]) if half == 0 else np.int32(0)
                    for r in range(ROWS):
                        scaled = np.int32(np.int32(scq[r]) * np.int32(np.int32(s16[t, r]) + offset))
                        blocks[bb, t, r] = scaled if half == 0 else np.int32(blocks[bb, t, r] + scaled)
        _k_superblock(acc, blocks, d, m, mn, True, xd, xsum, g, sb, t0, n_tok)
    _store_tile(acc, out, np.int64(g), np.int64(t0), n_tok)


@njit(parallel=True, **_KERNEL)
def _matmul_q5k(x, qs, qh, d, m, sc, mn, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, _ = _quantize(x, ACT_Q8_K)
    a = (qs, qh, d, m, sc, mn, xq, xd, _activation_sums32(xq), out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _q5k_tile, a, _q5k_tile, a, g)


@njit(inline="always")
def _q5k_tile_vnni(a, g, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """Q5_K on vpdpbusd (_q5k_block_sums: Q4_K's blocks with the fifth bits merged), every tile size;
    the same integers as _q5k_tile, the same _k_superblock."""
    qs, qh, d, m, sc, mn, xb, xd, xsum, out = a
    acc = stack_tile_f32()
    blocks_ptr = _alloca_i32(2048)
    blocks, flat_blocks = carray(blocks_ptr, (8, 8, 32)), carray(blocks_ptr, (2048,))
    qs_g, qh_g, sc_g = qs[g], qh[g], sc[g]
    _zero_tile(acc, n_tok)
    for sb in range(xd.shape[1] // 8):
        for bb in range(8):
            b = sb * 8 + bb
            at, qh_at, sc_at = b * 16 * ROWS, b * 4 * ROWS, b * ROWS
            if n_tok == 8:
                _q5k_block_sums4(flat_blocks, bb * 256, qs_g, at, qh_g, qh_at, xb, t0, b * 8, sc_g, sc_at)
                _q5k_block_sums4(
                    flat_blocks, bb * 256 + 128, qs_g, at, qh_g, qh_at, xb, t0 + 4, b * 8, sc_g, sc_at
                )
            elif n_tok == 4:
                _q5k_block_sums4(flat_blocks, bb * 256, qs_g, at, qh_g, qh_at, xb, t0, b * 8, sc_g, sc_at)
            elif n_tok == 2:
                _q5k_block_sums2(flat_blocks, bb * 256, qs_g, at, qh_g, qh_at, xb, t0, b * 8, sc_g, sc_at)
            else:
                _q5k_block_sums1(flat_blocks, bb * 256, qs_g, at, qh_g, qh_at, xb, t0, b * 8, sc_g, sc_at)
        _k_superblock(acc, blocks, d, m, mn, True, xd, xsum, g, sb, t0, n_tok)
    _store_tile(acc, out, np.int64(g), np.int64(t0), n_tok)


@njit(parallel=True, **_KERNEL)
def _matmul_q5k_vnni(x, qs, qh, d, m, sc, mn, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, _ = _quantize(x, ACT_Q8_K)
    a = (qs, qh, d, m, sc, mn, _activation_quads(xq), xd, _activation_sums32(xq), out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _q5k_tile_vnni, a, _q5k_tile_vnni, a, g)
