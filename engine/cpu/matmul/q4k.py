"""The Q4_K matmul kernels (field arrays on int16 tiles, records on byte dot products) and the
super-block scaling Q5_K and Q6_K share."""

from __future__ import annotations

import numpy as np
from numba import carray, njit, prange

from engine.cpu.chunks import chunk_starts
from engine.cpu.matmul.activations import ACT_Q8_K, _activation_quads, _activation_sums32, _quantize
from engine.cpu.matmul.intrinsics import (
    _k_min_sums,
    _q4k_record_sums1,
    _q4k_record_sums2,
    _q4k_record_sums4,
)
from engine.cpu.matmul.tiles import (
    _KERNEL,
    _alloca_i32,
    _each_tile,
    _lanes,
    _store_tile,
    _take_chunks,
    _zero_tile,
    f16_to_f32,
    stack_tile_f32,
    stack_tile_i16,
)
from engine.cpu.records import Q4K_D, Q4K_RECORD, q4k_block_at
from engine.quant import QK, ROWS

# Q4_K (and Q5_K's scales) in llama.cpp's order: each 32-block's integer sum times its 6-bit scale,
# added in int32 over the super-block (|sum| <= 32 * 15 * 127 per block, x 63 x 8 blocks ~ 30.7M), the
# mins as integer activation sums times the 6-bit mins, and the float scaling once per super-block:
# d * xd * isum - dmin * xd * imin. The half-block float scaling before (f16 d, times sc, times xd,
# per 16 weights) cost as much as the vpdpbusd work at one token: 4096 x 2048, one thread, thread CPU
# time, best of 20 (load 10-12, so ranges of two runs): Q4_K T=1 0.224-0.380 -> 0.113-0.133 ms, T=8
# 0.62-1.06 -> 0.49 ms; Q6_K T=1 0.27-0.31 -> 0.22-0.25 ms (docs/performance.md).
# The tiles keep the 8 blocks' scaled sums in a stack array indexed by the block (memory, not registers:
# a super-block int32 accumulator beside the float tile and the vpdpbusd sums spilled at 8 tokens,
# 6.7x slower at T = 16 in a first try); the epilogue adds them up per row lane. The scale multiply
# sits in the vpdpbusd intrinsic (_q4k_block_sums): as a lane loop storing into that array LLVM
# scalarized it (32 imul a block), and Q4_K's T=4 / T=8 tiles ran 1.8x / 3.6x slower than before.
# The mins' integer sums are an intrinsic too (_k_min_sums): as a lane loop over the rows (indexed in
# the records' mins or field arrays' mn) LLVM unrolled them into 32 scalar imul chains, and that
# epilogue took two thirds of a multi-token Q4_K tile. 12288 x 2048 (Qwen3.5-2B's gate|up), one thread,
# thread CPU time, best of many (Xeon VM of 2026-12-06, load 3.5): T=4 2.60 -> 1.16 ms, T=8 5.02 ->
# 1.62 ms (40 -> 124 GMAC/s), T=512 310 -> 106 ms; T=1 0.89 -> 0.88 ms. Outputs bitwise the same.


@njit(inline="always")
def _k_superblock(acc, blocks, d, m, mn, with_min, xd, xsum, g, sb, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """acc += d * xd * sum_b blocks[b] (- dmin * xd * sum_b mn[b] * xsum[b] `with_min`) for super-block
    sb of row group g; blocks[b, t, r] = scale x integer sum of block sb * 8 + b, token t0 + t, row r.
    One function for every tile and both paths, so a token's output does not depend on its tile."""
    dq, mq = _lanes(d, g, sb), _lanes(m, g, sb)
    _k_superblock_lanes(acc, blocks, dq, mq, mn[g], sb * 8 * ROWS, with_min, xd, xsum, sb, t0, n_tok)


@njit(inline="always")
def _k_superblock_lanes(acc, blocks, dq, mq, mn_g, mn_at, with_min, xd, xsum, sb, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """_k_superblock on the group's 32 d and dmin lanes, the mins of block sb * 8 + bb at mn_g[mn_at +
    bb * 32:] (the field arrays and Q4_K's records, engine/cpu/records.py, place them apart)."""
    imin = carray(_alloca_i32(ROWS), (ROWS,))
    for t in range(n_tok):
        xdt = xd[t0 + t, sb * 8]
        if with_min:
            _k_min_sums(imin, mn_g, mn_at, xsum, t0 + t, sb * 8)
        for r in range(ROWS):
            isum = np.int32(0)
            for bb in range(8):
                isum = np.int32(isum + blocks[bb, t, r])
            if with_min:
                dmin = f16_to_f32(mq[r]) * xdt
                acc[t, r] += f16_to_f32(dq[r]) * xdt * np.float32(isum) - dmin * np.float32(imin[r])
            else:
                acc[t, r] += f16_to_f32(dq[r]) * xdt * np.float32(isum)


@njit(inline="always")
def _q4k_tile(a, g, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """Q4_K on int16 lanes: half-block sums as _q4_tile's, then _k_superblock."""
    qs, d, m, sc, mn, xq, xd, xsum, out = a
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
                for jj in range(8):
                    j = half * 8 + jj
                    wq = _lanes(qs, g, b * 16 + j)
                    for t in range(n_tok):
                        xlo = xq[t0 + t, b * QK + j]
                        xhi = xq[t0 + t, b * QK + j + 16]
                        for r in range(ROWS):
                            v = wq[r]
                            s16[t, r] += np.int16(v & 15) * xlo + np.int16(v >> 4) * xhi
                for t in range(n_tok):
                    for r in range(ROWS):
                        scaled = np.int32(np.int32(scq[r]) * np.int32(s16[t, r]))
                        blocks[bb, t, r] = scaled if half == 0 else np.int32(blocks[bb, t, r] + scaled)
        _k_superblock(acc, blocks, d, m, mn, True, xd, xsum, g, sb, t0, n_tok)
    _store_tile(acc, out, np.int64(g), np.int64(t0), n_tok)


@njit(inline="always")
def _q4k_block_vnni(flat_blocks, bb, rec_g, first, xb, t0, b, sc_at, n_tok) -> None:  # type: ignore[no-untyped-def]
    """Block b (the bb-th of its super-block) of a Q4_K record into flat_blocks: its nibble bytes at
    rec_g[first:], its scales at rec_g[sc_at:] (constants after inlining)."""
    if n_tok == 8:  # twice 4 tokens (see _q6k_block_sums1's comment)
        _q4k_record_sums4(flat_blocks, bb * 256, rec_g, first, xb, t0, b * 8, rec_g, sc_at)
        _q4k_record_sums4(flat_blocks, bb * 256 + 128, rec_g, first, xb, t0 + 4, b * 8, rec_g, sc_at)
    elif n_tok == 4:
        _q4k_record_sums4(flat_blocks, bb * 256, rec_g, first, xb, t0, b * 8, rec_g, sc_at)
    elif n_tok == 2:
        _q4k_record_sums2(flat_blocks, bb * 256, rec_g, first, xb, t0, b * 8, rec_g, sc_at)
    else:
        _q4k_record_sums1(flat_blocks, bb * 256, rec_g, first, xb, t0, b * 8, rec_g, sc_at)


@njit(parallel=True, **_KERNEL)
def _matmul_q4_k(x, qs, d, m, sc, mn, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, _ = _quantize(x, ACT_Q8_K)
    a = (qs, d, m, sc, mn, xq, xd, _activation_sums32(xq), out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _q4k_tile, a, _q4k_tile, a, g)


@njit(inline="always")
def _q4k_record_tile(a, g, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    _q4k_record_tile_to(a, g, g, t0, n_tok)


@njit(inline="always")
def _q4k_record_tile_to(a, g, go, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """Q4_K's records (engine/cpu/records.py) on vpdpbusd, a whole block per call, every tile size: the
    same integers as _q4k_tile, the same _k_superblock; `rec16` is the records as uint16 (the d and
    dmin lanes)."""
    rec, rec16, mn, xb, xd, xsum, out = a
    acc = stack_tile_f32()
    blocks_ptr = _alloca_i32(2048)
    blocks, flat_blocks = carray(blocks_ptr, (8, 8, 32)), carray(blocks_ptr, (2048,))
    rec_g, rec16_g = rec[g], rec16[g]
    _zero_tile(acc, n_tok)
    for sb in range(xd.shape[1] // 8):
        at = sb * Q4K_RECORD
        for bb in range(8):
            sc_at, first = q4k_block_at(at, bb)
            _q4k_block_vnni(flat_blocks, bb, rec_g, first, xb, t0, sb * 8 + bb, sc_at, n_tok)
        dm = (at + Q4K_D) // 2
        dq, mq = rec16_g[dm : dm + ROWS], rec16_g[dm + ROWS : dm + 2 * ROWS]
        _k_superblock_lanes(acc, blocks, dq, mq, mn[g], sb * 8 * ROWS, True, xd, xsum, sb, t0, n_tok)
    _store_tile(acc, out, np.int64(go), np.int64(t0), n_tok)


@njit(parallel=True, **_KERNEL)
def _matmul_q4k_records(x, rec, rec16, mn, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, _ = _quantize(x, ACT_Q8_K)
    a = (rec, rec16, mn, _activation_quads(xq), xd, _activation_sums32(xq), out)
    for g in prange(rec.shape[0]):
        _each_tile(xq.shape[0], _q4k_record_tile, a, _q4k_record_tile, a, g)


@njit(parallel=True, **_KERNEL)
def _matmul_q4k_records_chunked(x, rec, rec16, mn, out, n_threads) -> None:  # type: ignore[no-untyped-def]
    xq, xd, _ = _quantize(x, ACT_Q8_K)
    a = (rec, rec16, mn, _activation_quads(xq), xd, _activation_sums32(xq), out)
    starts, taken = chunk_starts(rec.shape[0], n_threads), np.zeros(1, np.int64)
    for _ in prange(n_threads):
        _take_chunks(xq.shape[0], _q4k_record_tile, a, _q4k_record_tile, a, starts, taken)
