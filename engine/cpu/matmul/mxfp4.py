"""The MXFP4 matmul kernels (gpt-oss's expert weights) and its embedding lookup.

A 32-weight block is an E8M0 exponent byte e and 16 bytes of nibbles paired (j, j + 16) as Q4_0's; each
nibble indexes MXFP4_LEVELS (E2M1 values doubled: 0, +-1, +-2, +-3, +-4, +-6, +-8, +-12) and the block
scale is 2^(e - 128) (ggml's E8M0 halved). The activations are llama.cpp's q8_0 blocks
(ggml's vec_dot_type for MXFP4), and a block contributes (x scale x 2^(e - 128)) x its integer sum, as
ggml_vec_dot_mxfp4_q8_0 adds it. Packed as Q4_0 (qs) with the exponents in sc (engine/quant.py).

Byte dot-product tiles (every level but portable): each nibble vector looked up by vpshufb as level + 16
(4 .. 28, unsigned bytes on every level, small enough for AVX2's int16 word sums), 16 x the half
block's activation sum off (engine/cpu/matmul/intrinsics.py's centred half sums, as Q5_0's), both halves
added in int32 before the block's one float scaling: the same integers and the same float steps as
the portable int32 tiles, so every level gives the same outputs to the bit.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit, prange

from engine.cpu import simd
from engine.cpu.matmul.activations import ACT_Q8_0, _activation_quads, _half_block_sums, _quantize
from engine.cpu.matmul.intrinsics import _bytes, _centred_half_sums, _nibble_quads
from engine.cpu.matmul.tiles import (
    _KERNEL,
    _alloca_i32,
    _each_tile,
    _lanes,
    _store_tile,
    _zero_tile,
    stack_tile_f32,
    stack_tile_i32,
)
from engine.cpu.vecmath import bits_to_f32
from engine.quant import MXFP4_LEVELS, QK, ROWS

OFFSET_BITS = 4  # the byte tiles' weights are level + 16
_LEVEL_BYTES = _bytes([int(MXFP4_LEVELS[i % 16]) + (1 << OFFSET_BITS) for i in range(64)])


def _mxfp4_weights(context, builder, sig, args, at0, qh_at0, q: int):  # type: ignore[no-untyped-def]
    """The level + 16 bytes of quad q per 16-row lane (_LEVEL_BYTES): one vpshufb per nibble vector."""
    out = []
    for lane in _nibble_quads(context, builder, sig.args[1], args[1], at0, q):
        levels = [simd.byte_lookup(builder, _LEVEL_BYTES, builder.bitcast(v, simd.V64I8)) for v in lane]
        out.append(tuple(builder.bitcast(v, simd.V16I32) for v in levels))
    return out


_half_sums1 = _centred_half_sums(1, simd.chains(4), _mxfp4_weights, OFFSET_BITS)
_half_sums2 = _centred_half_sums(2, simd.chains(2), _mxfp4_weights, OFFSET_BITS)
_half_sums4 = _centred_half_sums(4, 1, _mxfp4_weights, OFFSET_BITS)


@njit(inline="always")
def e8m0_half(e: np.uint8) -> np.float32:
    """2^(e - 128) as float32 (ggml_e8m0_to_fp32_half: e < 2 give subnormals)."""
    bits = np.int64(0x00200000) << np.int64(e) if e < 2 else (np.int64(e) - 1) << 23
    return bits_to_f32(bits)


@njit(inline="always")
def _add_blocks(acc, sums, sc, g, b, xd, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """acc += (x scale x 2^(e - 128)) x the block's integer sums, ggml's order of the float steps."""
    scq = _lanes(sc, g, b)
    for t in range(n_tok):
        xdt = xd[t0 + t, b]
        for r in range(ROWS):
            acc[t, r] += (xdt * e8m0_half(scq[r])) * np.float32(sums[t, r])


@njit(inline="always")
def _mxfp4_tile(a, g, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    qs, sc, xq, xd, out = a
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
                    s32[t, r] += np.int32(MXFP4_LEVELS[v & 15]) * xlo + np.int32(MXFP4_LEVELS[v >> 4]) * xhi
        _add_blocks(acc, s32, sc, g, b, xd, t0, n_tok)
    _store_tile(acc, out, np.int64(g), np.int64(t0), n_tok)


@njit(inline="always")
def _half_vnni(sums, qs_g, b, half, xb, xh, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """sums[t * 32 + r] = half `half` of block b's integer sum, for the tile's tokens."""
    at, col, h = (b * 16 + half * 8) * ROWS, b * 8 + half * 2, 2 * b + half
    if n_tok == 8:
        _half_sums4(sums, qs_g, at, qs_g, 0, xb, t0, col, xh, h)
        _half_sums4(sums[128:], qs_g, at, qs_g, 0, xb, t0 + 4, col, xh, h)
    elif n_tok == 4:
        _half_sums4(sums, qs_g, at, qs_g, 0, xb, t0, col, xh, h)
    elif n_tok == 2:
        _half_sums2(sums, qs_g, at, qs_g, 0, xb, t0, col, xh, h)
    else:
        _half_sums1(sums, qs_g, at, qs_g, 0, xb, t0, col, xh, h)


@njit(inline="always")
def _mxfp4_tile_vnni(a, g, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """The byte dot-product tile, every tile size: both halves' sums, added, then the block's scaling."""
    qs, sc, xb, xh, xd, out = a
    acc = stack_tile_f32()
    low_ptr, high_ptr = _alloca_i32(256), _alloca_i32(256)
    low, high = carray(low_ptr, (8, 32)), carray(high_ptr, (8, 32))
    flat_low, flat_high = carray(low_ptr, (256,)), carray(high_ptr, (256,))
    qs_g = qs[g]
    _zero_tile(acc, n_tok)
    for b in range(xd.shape[1]):
        _half_vnni(flat_low, qs_g, b, 0, xb, xh, t0, n_tok)
        _half_vnni(flat_high, qs_g, b, 1, xb, xh, t0, n_tok)
        for t in range(n_tok):
            for r in range(ROWS):
                low[t, r] += high[t, r]
        _add_blocks(acc, low, sc, g, b, xd, t0, n_tok)
    _store_tile(acc, out, np.int64(g), np.int64(t0), n_tok)


@njit(parallel=True, **_KERNEL)
def _matmul_mxfp4_vnni(x, qs, sc, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, _ = _quantize(x, ACT_Q8_0)
    a = (qs, sc, _activation_quads(xq), _half_block_sums(xq), xd, out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _mxfp4_tile_vnni, a, _mxfp4_tile_vnni, a, g)


@njit(parallel=True, **_KERNEL)
def _matmul_mxfp4(x, qs, sc, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, _ = _quantize(x, ACT_Q8_0)
    a = (qs, sc, xq, xd, out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _mxfp4_tile, a, _mxfp4_tile, a, g)


@njit(parallel=True, **_KERNEL)
def _rows_mxfp4(ids, qs, sc, out) -> None:  # type: ignore[no-untyped-def]
    """out[i] = row ids[i] dequantized, as engine.quant.dequantize gives it."""
    for i in prange(len(ids)):
        g, r = ids[i] // ROWS, ids[i] % ROWS
        for b in range(out.shape[1] // QK):
            d = e8m0_half(sc[g, b * ROWS + r])
            for j in range(16):
                v = qs[g, (b * 16 + j) * ROWS + r]
                out[i, b * QK + j] = d * np.float32(MXFP4_LEVELS[v & 15])
                out[i, b * QK + j + 16] = d * np.float32(MXFP4_LEVELS[v >> 4])
