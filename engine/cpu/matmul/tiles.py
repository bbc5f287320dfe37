"""Shared tile plumbing of the CPU matmul kernels: their compile options, f16 scales, stack tiles and the
loops that hand a row group's tokens to a format's tile."""

from __future__ import annotations

import numpy as np
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from engine.cpu.chunks import take_next
from engine.cpu.vecmath import bits_to_f32, f32_to_bits
from engine.quant import ROWS

# fastmath without "reassoc": with it LLVM turned acc += (w * d) * x into a multiply and an FMA per
# token ((w * x) * d) instead of one FMA, 1.35x slower on Q8_0. The lanes need no reassociation.
_KERNEL = {"cache": True, "nogil": True, "fastmath": {"nnan", "ninf", "nsz", "arcp", "contract", "afn"}}
# The activation quantizers divide exactly as llama.cpp does: under fastmath's "arcp" LLVM turned
# amax / 127 into a multiply by 1/127, and that one-ulp change flipped a rounding now and then (a
# synthetic Q4_1 model's logits were 0.7% off llama.cpp's on one token of 16; exact division: 1e-7).
_EXACT = {"cache": True, "nogil": True}


# LLVM-level helpers Numba does not offer on the CPU.
#
# - f16_to_f32: Numba has no float16 arrays on the CPU, so f16 scales travel as uint16 bits and are
#   converted with integer shifts, a bit cast and one multiply, which vectorize.
# - stack tiles: fixed-size scratch on the stack. `np.zeros` in a kernel is a heap allocation LLVM
#   cannot see through, so sums written to it stay in memory; an alloca indexed by constants (after
#   unrolling) is promoted to vector registers.


_F16_REBIAS = np.float32(2.0**112)  # exponent bias 15 -> 127 by a multiply, exact for subnormals too


@njit(**_KERNEL)
def f16_to_f32(bits: np.uint16) -> np.float32:
    """float32 value of the IEEE half whose bits are the uint16 `bits` (inf/NaN not preserved).

    Integer shifts and a multiply, not LLVM's `half` type: vectors of `half` are scalarized on x86
    without AVX512-FP16 (one insert per lane), while this form vectorizes like any int/float code.
    """
    h = np.int64(bits)
    magnitude = bits_to_f32((h & 0x7FFF) << 13) * _F16_REBIAS
    return bits_to_f32(np.int64(f32_to_bits(magnitude)) | ((h & 0x8000) << 16))


def _alloca_intrinsic(dtype: types.Number):  # type: ignore[no-untyped-def]
    @intrinsic
    def alloca(typingctx, count):  # type: ignore[no-untyped-def]
        if not isinstance(count, types.IntegerLiteral):
            return None
        n = count.literal_value

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            return cgutils.alloca_once(builder, context.get_value_type(dtype), size=n)

        return types.CPointer(dtype)(count), codegen

    return alloca


_alloca_i16 = _alloca_intrinsic(types.int16)
_alloca_i32 = _alloca_intrinsic(types.int32)
_alloca_f32 = _alloca_intrinsic(types.float32)


@njit(inline="always")
def stack_tile_i16() -> np.ndarray:
    return carray(_alloca_i16(256), (8, 32))


@njit(inline="always")
def stack_tile_i32() -> np.ndarray:
    return carray(_alloca_i32(256), (8, 32))


@njit(inline="always")
def stack_tile_f32() -> np.ndarray:
    return carray(_alloca_f32(256), (8, 32))


def to_f32(v):  # type: ignore[no-untyped-def]
    """float32 of a weight element: a float, or f16 bits stored as uint16."""
    raise NotImplementedError("only callable from compiled code")


@overload(to_f32, inline="always")
def _to_f32(v):  # type: ignore[no-untyped-def]
    if isinstance(v, types.Integer) and v.bitwidth == 16 and not v.signed:
        return lambda v: f16_to_f32(v)
    if isinstance(v, types.Integer) and v.bitwidth == 16:  # bf16 bits, packed as int16
        return lambda v: bits_to_f32(np.int32(v) << 16)
    return lambda v: np.float32(v)


# Shared tile plumbing. What LLVM vectorizes well here (measured): lane loops over slices of the packed
# arrays with the per-lane expression written inline (scale conversions included; LLVM hoists them out
# of the token loop), and as few stack arrays as possible: an intermediate (32,) stack array of
# converted weights or scales made the loops 3-10x slower.
#
# inline="always" (Numba IR inlining) is kept for what must be a constant inside the loops (tile size,
# shift, kind) and for the stack allocas; small helpers are plain functions that LLVM inlines. IR
# inlining deep-copies the callee's IR at every call site: it made up half of the compile time.


@njit(**_KERNEL)
def _lanes(a: np.ndarray, g: int, pos: int) -> np.ndarray:
    """The 32 row lanes of position `pos` of group g, as a slice indexed from 0."""
    return a[g, pos * ROWS : pos * ROWS + ROWS]


@njit(**_KERNEL)
def _zero_tile(acc: np.ndarray, n_tok: int) -> None:
    for t in range(n_tok):
        for r in range(ROWS):
            acc[t, r] = 0


# The tiles call it with np.int64(g), np.int64(t0): a row group from a prange is uint64, t0 a literal 0 in
# one kernel and a variable in the next, and each mix compiled a copy of its own (16 for SmolLM2, now 4).
@njit(**_KERNEL)
def _store_tile(acc: np.ndarray, out: np.ndarray, g: int, t0: int, n_tok: int) -> None:
    n_valid = min(ROWS, out.shape[1] - g * ROWS)
    for t in range(n_tok):
        dst = out[t0 + t, g * ROWS : g * ROWS + n_valid]
        if n_valid == ROWS:
            for r in range(ROWS):
                dst[r] = acc[t, r]
        else:
            for r in range(n_valid):
                dst[r] = acc[t, r]


@njit(inline="always")
def _each_tile(n_tok, tile, args, small_tile, small_args, g) -> None:  # type: ignore[no-untyped-def]
    """Tokens 0 .. n_tok of row group g in tiles, the largest first: tile(args, g, t0, n) for n = 8 and 4,
    small_tile(small_args, g, t0, n) for n = 2 and 1 (the same tile, or the int16 one beside a VNNI tile).

    Every call inlines a copy of the tile (inline="always") with n a constant, so LLVM unrolls its token
    loops and keeps its sums in registers, as with one loop per format calling its tile with literal
    sizes (measured against that: bitwise the same outputs, no slowdown). Numba's IR inliner follows the
    argument `tile` back to the global function it names; it rejects *args, hence each format's arrays
    in a tuple, built once per call outside the parallel loop (built per row group, the tuple's reference
    counting measured a few per cent slower at T = 1).
    """
    t0 = 0
    while t0 < n_tok:
        left = n_tok - t0
        if left >= 8:
            tile(args, g, t0, 8)
            t0 += 8
        elif left >= 4:
            tile(args, g, t0, 4)
            t0 += 4
        elif left >= 2:
            small_tile(small_args, g, t0, 2)
            t0 += 2
        else:
            small_tile(small_args, g, t0, 1)
            t0 += 1


@njit(inline="always")
def _take_chunks(n_tok, tile, args, small_tile, small_args, starts, taken) -> None:  # type: ignore[no-untyped-def]
    """One thread's share of a kernel whose row groups go out in chunks (engine/cpu/chunks.py): chunks
    from the counter `taken` until none is left, each group's tokens by _each_tile."""
    c = take_next(taken)
    while c < starts.shape[0] - 1:
        for g in range(starts[c], starts[c + 1]):
            _each_tile(n_tok, tile, args, small_tile, small_args, g)
        c = take_next(taken)
