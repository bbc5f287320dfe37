"""The Q6_K matmul kernels (field arrays on int16 tiles, row quads on byte dot products)."""

from __future__ import annotations

import numpy as np
from numba import carray, njit, prange

from engine.cpu.chunks import chunk_starts
from engine.cpu.matmul.activations import ACT_Q8_K, _activation_quads, _quantize
from engine.cpu.matmul.intrinsics import _q6k_block_sums1, _q6k_block_sums2, _q6k_block_sums4
from engine.cpu.matmul.q4k import _k_superblock
from engine.cpu.matmul.tiles import (
    _KERNEL,
    _alloca_i32,
    _each_tile,
    _lanes,
    _store_tile,
    _take_chunks,
    _zero_tile,
    stack_tile_f32,
    stack_tile_i16,
)
from engine.quant import QK, ROWS

# Q6_K: low nibbles as the 4-bit layout; top two bits of positions (j, j + 16) in qh byte j // 2 of
# the block, bits 4 * (j % 2) + (0..1, 2..3). Positions j (< 16) and j + 16 lie in different
# 16-weight sub-blocks, so they keep separate sums; 8 products of at most 32 * 127 fit int16.


@njit(inline="always")
def _q6k_position(slo, shi, qs, wh, shift, xq, g, b, j, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """slo, shi += weights j, j + 16 of block b times their activations; `shift` a literal (see Q5_0)."""
    wq = _lanes(qs, g, b * 16 + j)
    for t in range(n_tok):
        xlo = xq[t0 + t, b * QK + j]
        xhi = xq[t0 + t, b * QK + j + 16]
        for r in range(ROWS):
            v = np.int16(wq[r])
            h = np.int16(wh[r] >> shift)
            lo = np.int16(np.int16(v & 15) | np.int16((h & 3) << 4))
            hi = np.int16(np.int16(v >> 4) | np.int16((h & 12) << 2))
            slo[t, r] += np.int16(lo - 32) * xlo
            shi[t, r] += np.int16(hi - 32) * xhi


@njit(inline="always")
def _q6k_tile(a, g, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """Q6_K on int16 lanes: per block sc_lo x (sum of q - 32 over weights j < 16) + sc_hi x (over j + 16)
    in int32, the super-block's float scaling once in _k_superblock, as llama.cpp (|sum| per 16 weights
    <= 16 * 32 * 127, x 128, x 16 sub-blocks ~ 133M: int32)."""
    qs, qh, sc, d, xq, xd, out = a
    acc = stack_tile_f32()
    slo = stack_tile_i16()
    shi = stack_tile_i16()
    blocks = carray(_alloca_i32(2048), (8, 8, 32))
    _zero_tile(acc, n_tok)
    for sb in range(xd.shape[1] // 8):
        for bb in range(8):
            b = sb * 8 + bb
            sclo, schi = _lanes(sc, g, 2 * b), _lanes(sc, g, 2 * b + 1)
            for half in range(2):
                _zero_tile(slo, n_tok)
                _zero_tile(shi, n_tok)
                for p in range(4 * half, 4 * half + 4):
                    wh = _lanes(qh, g, b * 8 + p)
                    _q6k_position(slo, shi, qs, wh, 0, xq, g, b, 2 * p, t0, n_tok)
                    _q6k_position(slo, shi, qs, wh, 4, xq, g, b, 2 * p + 1, t0, n_tok)
                for t in range(n_tok):
                    for r in range(ROWS):
                        lo = np.int32(np.int32(sclo[r]) * np.int32(slo[t, r]))
                        hi = np.int32(np.int32(schi[r]) * np.int32(shi[t, r]))
                        scaled = np.int32(lo + hi)
                        blocks[bb, t, r] = scaled if half == 0 else np.int32(blocks[bb, t, r] + scaled)
        _k_superblock(acc, blocks, d, d, d, False, xd, xd, g, sb, t0, n_tok)
    _store_tile(acc, out, np.int64(g), np.int64(t0), n_tok)


# Every tile on VNNI CPUs: the unsigned 6-bit weights on vpdpbusd, minus 32 x the activations' sum of
# each 16 positions, times the scales (_q6k_block_sums): the int16 path's integers exactly, the same
# _k_superblock. Tiles of 4 and 8 tokens took the int16 path until 2026-12-03: against it 0.53x the time
# at T = 8, 0.51x at 16, 0.47x at 64 (scripts/ab_matmul.py --rev 75fecee, 32768x512, 2 threads).


@njit(inline="always")
def _q6k_block(blocks, out_at, qs_g, at, qh_g, xb, t0, b, sc_g, x16, n_tok) -> None:  # type: ignore[no-untyped-def]
    """_q6k_block_sums of block b for a tile of 1, 2 or 4 tokens (constants after inlining)."""
    qh_at, col, sc_at = b * 8 * ROWS, b * 8, 2 * b * ROWS
    if n_tok == 4:
        _q6k_block_sums4(blocks, out_at, qs_g, at, qh_g, qh_at, xb, t0, col, sc_g, sc_at, x16)
    elif n_tok == 2:
        _q6k_block_sums2(blocks, out_at, qs_g, at, qh_g, qh_at, xb, t0, col, sc_g, sc_at, x16)
    else:
        _q6k_block_sums1(blocks, out_at, qs_g, at, qh_g, qh_at, xb, t0, col, sc_g, sc_at, x16)


@njit(inline="always")
def _q6k_row_quad_tile(a, g, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    _q6k_row_quad_tile_to(a, g, g, t0, n_tok)


@njit(inline="always")
def _q6k_row_quad_tile_to(a, g, go, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """The tile on Q6_K in row quads (engine/cpu/records.py): its qs and qh permuted, sc and d as they are."""
    qs, qh, sc, d, xb, x16, xd, out = a
    acc = stack_tile_f32()
    blocks_ptr = _alloca_i32(2048)
    blocks, flat_blocks = carray(blocks_ptr, (8, 8, 32)), carray(blocks_ptr, (2048,))
    qs_g, qh_g, sc_g = qs[g], qh[g], sc[g]
    _zero_tile(acc, n_tok)
    for sb in range(xd.shape[1] // 8):
        for bb in range(8):
            b, at = sb * 8 + bb, (sb * 8 + bb) * 16 * ROWS
            if n_tok == 8:  # twice 4 tokens (see _q6k_block_sums1's comment)
                _q6k_block(flat_blocks, bb * 256, qs_g, at, qh_g, xb, t0, b, sc_g, x16, 4)
                _q6k_block(flat_blocks, bb * 256 + 128, qs_g, at, qh_g, xb, t0 + 4, b, sc_g, x16, 4)
            else:
                _q6k_block(flat_blocks, bb * 256, qs_g, at, qh_g, xb, t0, b, sc_g, x16, n_tok)
        _k_superblock(acc, blocks, d, d, d, False, xd, xd, g, sb, t0, n_tok)
    _store_tile(acc, out, np.int64(go), np.int64(t0), n_tok)


@njit(**_KERNEL)
def _activation_sums16(xq: np.ndarray) -> np.ndarray:
    """The integer sum of each 16 consecutive int8 activations."""
    n_tok, k = xq.shape
    out = np.empty((n_tok, k // 16), np.int32)
    for t in range(n_tok):
        for i in range(k // 16):
            total = 0
            for c in range(16):
                total += np.int32(xq[t, 16 * i + c])
            out[t, i] = total
    return out


@njit(parallel=True, **_KERNEL)
def _matmul_q6k(x, qs, qh, sc, d, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, _ = _quantize(x, ACT_Q8_K)
    a = (qs, qh, sc, d, xq, xd, out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _q6k_tile, a, _q6k_tile, a, g)


@njit(parallel=True, **_KERNEL)
def _matmul_q6k_row_quads(x, qs, qh, sc, d, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, _ = _quantize(x, ACT_Q8_K)
    a = (qs, qh, sc, d, _activation_quads(xq), _activation_sums16(xq), xd, out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _q6k_row_quad_tile, a, _q6k_row_quad_tile, a, g)


@njit(parallel=True, **_KERNEL)
def _matmul_q6k_row_quads_chunked(x, qs, qh, sc, d, out, n_threads) -> None:  # type: ignore[no-untyped-def]
    xq, xd, _ = _quantize(x, ACT_Q8_K)
    a = (qs, qh, sc, d, _activation_quads(xq), _activation_sums16(xq), xd, out)
    starts, taken = chunk_starts(qs.shape[0], n_threads), np.zeros(1, np.int64)
    for _ in prange(n_threads):
        _take_chunks(xq.shape[0], _q6k_row_quad_tile, a, _q6k_row_quad_tile, a, starts, taken)
