"""The float matmul kernel (F32, F16 and BF16 weights) and the bf16 rounding of its activations."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from engine.cpu import isa
from engine.cpu.matmul.tiles import (
    _EXACT,
    _KERNEL,
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
