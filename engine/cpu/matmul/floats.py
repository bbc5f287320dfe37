"""The float matmul kernel (F32, F16 and BF16 weights) and the bf16 rounding of its activations."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.cpu import isa, simd
from engine.cpu.matmul.intrinsics import _plus
from engine.cpu.matmul.tiles import (
    _EXACT,
    _KERNEL,
    _alloca_f32,
    _each_tile,
    _lanes,
    _store_tile,
    _zero_tile,
    stack_tile_f32,
    to_f32,
)
from engine.cpu.vecmath import bits_to_f32, f32_to_bits
from engine.quant import ROWS

# Float path: F16, BF16 and F32 weights against the unquantized activations (llama.cpp's F32/F16 types
# take float activations too; BF16 rounds them to bf16 first, _round_to_bf16).


@njit(**_EXACT)
def _round_to_bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16 (ties to even) and back: llama.cpp's BF16 dot products take bf16
    activations (ggml's vec_dot_type for BF16), so Llamba's float path rounds them alike."""
    out = np.empty_like(x)
    for t in range(x.shape[0]):
        for k in range(x.shape[1]):
            bits = np.int64(f32_to_bits(x[t, k])) & 0xFFFFFFFF
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            out[t, k] = bits_to_f32(bits)
    return out


# Every product-add of the tiles is one explicit fused multiply-add (llvm.fma) on a level with FMA, and
# nothing else is contracted (_NO_CONTRACT below): with LLVM left to contract, it fused the tiles'
# multiply-adds differently for 8-, 4- and 1-token tiles, so a token's outputs depended on the tile it
# fell in (on what else was in its batch: 90-190 of 2304 outputs differed in the last bit); with no
# contraction at all every product was rounded and added apart, 2.3x the instructions (nomic-embed F16,
# 4 inputs of 132 tokens, 2 threads: 1.36 s a pass). One fma per product: the same bits in any tile, on
# every level with FMA; the portable level (no FMA unit: llvm.fma would be a libm call) multiplies and adds.
HAS_FMA = "fma" in isa.current().level.needs


@intrinsic
def _fma(typingctx, a, b, c):  # type: ignore[no-untyped-def]
    """a * b + c rounded once (llvm.fma.f32): vectorized as vfmadd."""

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        f32 = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [f32], ir.FunctionType(f32, [f32, f32, f32]))
        return builder.call(fn, args)

    return types.float32(types.float32, types.float32, types.float32), codegen


@njit(inline="always")
def _madd(a, b, c):  # type: ignore[no-untyped-def]
    if HAS_FMA:
        return _fma(a, b, c)
    return a * b + c


@njit(inline="always")
def _float_tile(a, g, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    f, x, out = a
    acc = stack_tile_f32()
    _zero_tile(acc, n_tok)
    n_cols = x.shape[1]
    # Two positions per step: with one, the lane loop is small enough for LLVM to unroll it fully
    # before vectorizing, and it then vectorizes the position loop with gathers instead (20x slower).
    for k in range(0, n_cols - 1, 2):
        w0, w1 = _lanes(f, g, k), _lanes(f, g, k + 1)
        for t in range(n_tok):
            x0, x1 = x[t0 + t, k], x[t0 + t, k + 1]
            for r in range(ROWS):
                acc[t, r] = _madd(to_f32(w1[r]), x1, _madd(to_f32(w0[r]), x0, acc[t, r]))
    if n_cols % 2:
        w0 = _lanes(f, g, n_cols - 1)
        for t in range(n_tok):
            x0 = x[t0 + t, n_cols - 1]
            for r in range(ROWS):
                acc[t, r] = _madd(to_f32(w0[r]), x0, acc[t, r])
    _store_tile(acc, out, np.int64(g), np.int64(t0), n_tok)


@njit(inline="always")
def _float_tokens(a, g, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """One-token tiles, the float path's small tiles: a 2-token tile's output differed from two 1-token
    tiles' in the last bits (FMA contraction) when loaded from Numba's cache."""
    for t in range(n_tok):
        _float_tile(a, g, t0 + t, 1)


_NO_CONTRACT = {**_KERNEL, "fastmath": _KERNEL["fastmath"] - {"contract"}}


@njit(parallel=True, **_NO_CONTRACT)
def _matmul_float(x, f, out) -> None:  # type: ignore[no-untyped-def]
    a = (f, x, out)
    for g in prange(f.shape[0]):
        _each_tile(x.shape[0], _float_tile, a, _float_tokens, a, g)


# Panels: the float kernel of the 256-bit FMA levels (avx2, avx-vnni). The tiles above keep 8 tokens x 32
# rows of sums, 32 ymm registers where AVX2 has 16: they spilled, and converted each f16 weight with
# integer shifts (five instructions a vector). A panel is 16 rows (two ymm of sums a token) by up to 6
# tokens: 12 sums, two weight vectors (one vcvtph2ps each) and a broadcast fill the 16 registers, one
# fma per product in the same order (position after position), so the same bits as the tiles. nomic-
# embed's 2304 x 768 F16 matrix, 240 tokens, one thread (2026-12-07, EPYC znver3): 24-31 GFLOP/s in the
# tiles, 75 in panels of 6 tokens (65 with 4, 36 with 3 tokens x 32 rows). Tiles of 1 and 2 tokens take
# all 32 rows (4 and 8 sums: a chain of fma latency a vector is too short with 2).
FLOAT_PANELS = HAS_FMA and not simd.WIDE
PANEL_ROWS = 16
_F32 = ir.FloatType()
_V8F32 = ir.VectorType(_F32, 8)
_I64 = ir.IntType(64)


def _float_vector(builder, ptr, dtype):  # type: ignore[no-untyped-def]
    """The 8 weights at ptr as <8 x float>: float32 as they are, f16 bits by vcvtph2ps (fpext of half
    vectors, F16C), bf16 bits (int16) shifted into the top half of a float."""
    if isinstance(dtype, types.Float):
        return builder.load(builder.bitcast(ptr, _V8F32.as_pointer()), align=4)
    v8i16 = ir.VectorType(ir.IntType(16), 8)
    raw = builder.load(builder.bitcast(ptr, v8i16.as_pointer()), align=2)
    if dtype.signed:
        v8i32 = ir.VectorType(ir.IntType(32), 8)
        return builder.bitcast(builder.shl(builder.zext(raw, v8i32), ir.Constant(v8i32, [16] * 8)), _V8F32)
    return builder.fpext(builder.bitcast(raw, ir.VectorType(ir.HalfType(), 8)), _V8F32)


def _panel_sums(n_tok: int, n_vec: int, into: bool = False):  # type: ignore[no-untyped-def]
    """An intrinsic: panel[t, :8 n_vec] = the sum over every position k < x.shape[1], in order, of
    w[k, col + r] x x[t0 + t, k], one fma per product. w is any 2-D float32, f16 (uint16) or bf16 (int16)
    array whose rows (positions) may be strided but whose columns are contiguous, x any 2-D float32 array
    with contiguous rows; columns col .. col + 8 n_vec of w must be readable. `into`: the sums are
    out[t0 + t, col .. col + 8 n_vec] (a float32 array with contiguous rows, its columns there writable),
    continued from what is there: one fma chain over the positions of several calls, the same bits as
    one call over all of them (a float32 stored and loaded again is exact)."""

    @intrinsic
    def panel_sums(typingctx, panel, w, x, t0, col):  # type: ignore[no-untyped-def]
        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            panel_type, w_type, x_type = sig.args[:3]
            t0_, col_ = (context.cast(builder, args[i], sig.args[i], types.intp) for i in (3, 4))
            w_array = context.make_array(w_type)(context, builder, args[1])
            x_array = context.make_array(x_type)(context, builder, args[2])
            panel_array = context.make_array(panel_type)(context, builder, args[0])
            first = cgutils.get_item_pointer(
                context, builder, w_type, w_array, [ir.Constant(_I64, 0), col_], wraparound=False
            )
            first = builder.bitcast(first, ir.IntType(8).as_pointer())
            step = builder.extract_value(w_array.strides, 0)  # bytes from one position to the next
            element = context.get_value_type(w_type.dtype).as_pointer()
            x_rows = [
                cgutils.get_item_pointer(
                    context, builder, x_type, x_array, [_plus(builder, t0_, t), ir.Constant(_I64, 0)]
                )
                for t in range(n_tok)
            ]
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_V8F32, [_V8F32] * 3), "llvm.fma.v8f32"
            )
            firsts = [
                _panel_target(context, builder, panel_type, panel_array, t0_, col_, t, into)
                for t in range(n_tok)
            ]
            targets = [[builder.gep(row, [ir.Constant(_I64, j)]) for j in range(n_vec)] for row in firsts]
            start = [
                [builder.load(p, align=4) if into else ir.Constant(_V8F32, [0.0] * 8) for p in row]
                for row in targets
            ]
            sums = [[cgutils.alloca_once_value(builder, s) for s in row] for row in start]
            with cgutils.for_range(builder, builder.extract_value(x_array.shape, 1)) as loop:
                at = builder.bitcast(builder.gep(first, [builder.mul(loop.index, step)]), element)
                weights = [
                    _float_vector(builder, builder.gep(at, [ir.Constant(_I64, 8 * j)]), w_type.dtype)
                    for j in range(n_vec)
                ]
                for t in range(n_tok):
                    xt = builder.load(builder.gep(x_rows[t], [loop.index]))
                    xv = builder.insert_element(ir.Constant(_V8F32, ir.Undefined), xt, ir.Constant(_I64, 0))
                    xv = builder.shuffle_vector(
                        xv, xv, ir.Constant(ir.VectorType(ir.IntType(32), 8), [0] * 8)
                    )
                    for j in range(n_vec):
                        total = builder.call(fma, [weights[j], xv, builder.load(sums[t][j])])
                        builder.store(total, sums[t][j])
            for t in range(n_tok):
                for j in range(n_vec):
                    builder.store(builder.load(sums[t][j]), targets[t][j], align=4)
            return context.get_dummy_value()

        return types.void(panel, w, x, t0, col), codegen

    return panel_sums


def _panel_target(context, builder, array_type, array, t0, col, t, into):  # type: ignore[no-untyped-def]
    """Where token t's sums go, as <8 x float>*: panel[t, 0], or out[t0 + t, col] `into` an output."""
    index = [_plus(builder, t0, t), col] if into else [ir.Constant(_I64, t), ir.Constant(_I64, 0)]
    ptr = cgutils.get_item_pointer(context, builder, array_type, array, index, wraparound=False)
    return builder.bitcast(ptr, _V8F32.as_pointer())


panel_sums6 = _panel_sums(6, 2)
panel_sums4 = _panel_sums(4, 2)
panel_sums2 = _panel_sums(2, 2)
panel_sums1 = _panel_sums(1, 2)
# Continued into an output (the encoder attention's scores and weighted values); 8 columns: the last of a
# width that is a multiple of 8 but not of 16 (SigLIP's heads of 72)
add_sums6 = _panel_sums(6, 2, into=True)
add_sums4 = _panel_sums(4, 2, into=True)
add_sums2 = _panel_sums(2, 2, into=True)
add_sums1 = _panel_sums(1, 2, into=True)
add_narrow6 = _panel_sums(6, 1, into=True)
add_narrow4 = _panel_sums(4, 1, into=True)
add_narrow2 = _panel_sums(2, 1, into=True)
add_narrow1 = _panel_sums(1, 1, into=True)
_panel2_wide = _panel_sums(2, 4)
_panel1_wide = _panel_sums(1, 4)


@njit(**_NO_CONTRACT)
def store_panel(panel: np.ndarray, out: np.ndarray, row0: int, t0: int, n_tok: int, n_rows: int) -> None:
    n_valid = min(n_rows, out.shape[1] - row0)
    for t in range(n_tok):
        for r in range(n_valid):
            out[t0 + t, row0 + r] = panel[t, r]


@njit(**_NO_CONTRACT)
def _float_panels(x: np.ndarray, f: np.ndarray, out: np.ndarray, g: int) -> None:
    """Row group g's outputs for every token: 6-token panels of 16 rows (4 for the rest of 4 or 5),
    then the last tokens in tiles of 2 and 1 over all 32 rows."""
    panel = carray(_alloca_f32(256), (8, 32))
    w = f[g].reshape((x.shape[1], ROWS))  # w[k, r]: row g * 32 + r at position k
    n_tok = x.shape[0]
    big = n_tok - n_tok % 6 + (4 if n_tok % 6 >= 4 else 0)
    for col in range(0, ROWS, PANEL_ROWS):
        if g * ROWS + col >= out.shape[1]:
            break
        t0 = 0
        while t0 < big:
            if big - t0 >= 6:
                panel_sums6(panel, w, x, t0, col)
                store_panel(panel, out, g * ROWS + col, t0, 6, PANEL_ROWS)
                t0 += 6
            else:
                panel_sums4(panel, w, x, t0, col)
                store_panel(panel, out, g * ROWS + col, t0, 4, PANEL_ROWS)
                t0 += 4
    t0 = big
    while t0 < n_tok:
        if n_tok - t0 >= 2:
            _panel2_wide(panel, w, x, t0, 0)
            store_panel(panel, out, g * ROWS, t0, 2, ROWS)
            t0 += 2
        else:
            _panel1_wide(panel, w, x, t0, 0)
            store_panel(panel, out, g * ROWS, t0, 1, ROWS)
            t0 += 1


# Many tokens run in blocks of about TOKEN_BLOCK_BYTES of activations, which stay in L2 while a thread
# takes every row group over them: a row group over all 4096 tokens of a SigLIP layer streamed 18.9 MB of
# activations from L3 per 16 rows. 4096 tokens, F16, 2 threads (2026-12-08, EPYC znver3, 5 rounds
# alternated): 1152 x 1152 58 -> 60-67 GMAC/s, 4304 x 1152 50-51 -> 54-62, 3072 x 768 47 -> 56-58. Blocks
# of fewer than MIN_TOKEN_BLOCK tokens (long rows) lost more to the weights streamed again per block:
# 1152 x 4304 57 -> 50-53.
TOKEN_BLOCK_BYTES = 192 * 1024
MIN_TOKEN_BLOCK = 24


@njit(**_NO_CONTRACT)
def _token_block(n_tok: int, n_cols: int) -> int:
    block = TOKEN_BLOCK_BYTES // (4 * n_cols) // 6 * 6  # whole panels of 6
    return block if block >= MIN_TOKEN_BLOCK else max(n_tok, 1)


@njit(parallel=True, **_NO_CONTRACT)
def _matmul_float_panels(x, f, out) -> None:  # type: ignore[no-untyped-def]
    block = _token_block(x.shape[0], x.shape[1])
    n_groups = f.shape[0]
    for job in prange(-(-x.shape[0] // block) * n_groups):
        t0, g = job // n_groups * block, job % n_groups
        _float_panels(x[t0 : t0 + block], f, out[t0 : t0 + block], np.int64(g))


matmul_float = _matmul_float_panels if FLOAT_PANELS else _matmul_float
