"""Quantized matrix multiplication and embedding lookup on the CPU: out[T, N] = x[T, K] @ W.T.

Weights come repacked by engine.quant.pack_weight: groups of 32 rows, each field row-interleaved, so
the 32 rows of a group sit in the lanes of one vector. For every weight position a kernel loads the
32 rows' quants, unpacks them once, and multiplies them by the broadcast activation of each token of
a tile of up to 8 tokens, keeping 32 per-row sums per token in vector registers: no horizontal sums.
Each weight byte is read from memory once per call (decode, T small, is bound by that) and decoded
once per tile of 8 tokens (prefill, bound by arithmetic).

Integer path (Q4_0, Q4_1, Q5_0, Q5_1, Q2_K-Q6_K; IQ4_NL, IQ4_XS with int32 sums): the
activations are quantized once per call to int8 values (held as int16 so one load broadcasts them)
exactly as llama.cpp's q8_0/q8_1/q8_K blocks (see ACTIVATIONS); the inner loop multiplies and adds
int16 lanes (vpmullw/vpaddw, 32 rows per instruction), or, on AVX-512 VNNI CPUs, vpdpwssd/vpdpbusd
from LLVM-IR intrinsics (the same integer sums).
Half a block's products always fit int16; the weight and activation scales are applied per half
block in float, the block minimum (Q4_1, Q4_0's -8) once per block through the activation sum. Q4_K,
Q5_K and Q6_K scale in llama.cpp's order instead: each (sub-)block's integer sum times its integer
scale, added in int32 over the 256-weight super-block, then one float scaling (mins likewise).

Float path (Q8_0, F16, BF16, F32): the weights are converted to float per position (once per token tile)
and multiplied by the unquantized activations with FMAs. For int8 weights this measured faster than
the int16 path (two int8 products already overflow int16) and it adds no activation rounding.

One compiled signature per type: the tile sizes (8, 4, 2, 1 tokens) are inlined into the kernel with
constant loop bounds, and the parallel loop runs over row groups only. The comments in the tile
code say which loop shapes LLVM vectorizes and which it does not (measured, not guessed).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, get_num_threads, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from engine.cpu import simd
from engine.cpu.chunks import chunk_starts, take_next
from engine.cpu.f16 import float_to_half
from engine.cpu.records import Q4K_D, Q4K_RECORD, q4k_block_at, q4k_nibble_at, q6k_top_at
from engine.cpu.vecmath import bits_to_f32, f32_to_bits
from engine.quant import IQ4_LEVELS, QK, ROWS, PackedWeight, QType

# fastmath without "reassoc": with it LLVM turned acc += (w * d) * x into a multiply and an FMA per
# token ((w * x) * d) instead of one FMA, 1.35x slower on Q8_0. The lanes need no reassociation.
_KERNEL = {"cache": True, "nogil": True, "fastmath": {"nnan", "ninf", "nsz", "arcp", "contract", "afn"}}
# The activation quantizers divide exactly as llama.cpp does: under fastmath's "arcp" LLVM turned
# amax / 127 into a multiply by 1/127, and that one-ulp change flipped a rounding now and then (a
# synthetic Q4_1 model's logits were 0.7% off llama.cpp's on one token of 16; exact division: 1e-7).
_EXACT = {"cache": True, "nogil": True}
F0 = np.float32(0.0)

# The scale/min rule of the 4-bit tiles; each kind has its own kernel with the kind as a constant.
KIND_Q4_0, KIND_Q4_1, KIND_Q4_K = 0, 1, 2
PARALLEL_QUANTIZE_TOKENS = 32  # below this the activations are quantized on the calling thread
# How activations are quantized, as llama.cpp pairs them with each weight type (its vec_dot_type):
# q8_0 (Q4_0, Q5_0, Q8_0, IQ4_NL), q8_1 (Q4_1, Q5_1: the block sum stored too), q8_K (K-quants, IQ4_XS).
ACT_Q8_0, ACT_Q8_1, ACT_Q8_K = 0, 1, 2
ACTIVATIONS = {
    QType.Q4_0: ACT_Q8_0,
    QType.Q4_1: ACT_Q8_1,
    QType.Q5_0: ACT_Q8_0,
    QType.Q5_1: ACT_Q8_1,
    QType.Q8_0: ACT_Q8_0,
    QType.IQ4_NL: ACT_Q8_0,
    QType.IQ4_XS: ACT_Q8_K,
    QType.Q2_K: ACT_Q8_K,
    QType.Q3_K: ACT_Q8_K,
    QType.Q4_K: ACT_Q8_K,
    QType.Q5_K: ACT_Q8_K,
    QType.Q6_K: ACT_Q8_K,
}


# ---------------------------------------------------------------------------------------------------
# LLVM-level helpers Numba does not offer on the CPU. They live in this file because Numba's cache
# checks only the timestamp of the file that defines a kernel, not of the files it calls into (the
# bit casts, plain LLVM instructions with nothing to edit, come from engine.cpu.vecmath).
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

# The byte dot-product kernels (the `_vnni` tiles; named for AVX-512 VNNI, which LLVM never produced
# from the int16 loops, nor from any loop shape tried): one vpdpwssd multiplies 16 int32 lanes, each
# holding two int16 weights, by two broadcast int16 activations and adds both products to 16 int32 sums
# (32 multiply-adds an instruction, where vpmullw + vpaddw do 32 in two). Written as LLVM IR in
# intrinsics, on whole 512-bit values, whose products engine/cpu/simd.py emits for the level in use:
# VNNI's, AVX-VNNI's or AVX2's instructions, the same integers. Only the portable level (no x86
# intrinsic) takes the int16 kernels; LLAMBA_CPU_LEVEL picks a lower level (engine/cpu/isa.py).
BYTE_DOT = simd.TARGET.level.byte_dot
_V16I32 = simd.V16I32
_V16I8 = ir.VectorType(ir.IntType(8), 16)


def _vector_at(context, builder, array_type, array, at, vector):  # type: ignore[no-untyped-def]
    """Pointer to array[at] as a pointer to `vector` (no bounds check: callers index inside)."""
    ary = context.make_array(array_type)(context, builder, array)
    item = cgutils.get_item_pointer(context, builder, array_type, ary, [at], wraparound=False)
    return builder.bitcast(item, vector.as_pointer())


def _widen_bytes16(context, builder, array_type, array, at, signed: bool):  # type: ignore[no-untyped-def]
    """The 16 bytes array[at:] widened to int32 lanes."""
    raw = builder.load(_vector_at(context, builder, array_type, array, at, _V16I8), align=1)
    return (builder.sext if signed else builder.zext)(raw, _V16I32)


def _splat(value: int):  # type: ignore[no-untyped-def]
    return ir.Constant(_V16I32, [value] * 16)


def _broadcast(builder, x32):  # type: ignore[no-untyped-def]
    """An int32 in all 16 lanes."""
    x = builder.insert_element(ir.Constant(_V16I32, ir.Undefined), x32, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(x, ir.Constant(_V16I32, ir.Undefined), _splat(0))


# The Q4_0 and Q4_1 decode tiles (1-2 tokens) prefetch their weight bytes this far ahead: the
# hardware prefetchers stop at 4 KiB boundaries. Measured in one process, the two variants alternated
# over Qwen-shaped matrices streaming through 206-293 MiB (scripts/bench_huge_pages.py, 2 threads,
# 2026-12-03): Q4_1 with it 28.76 / 26.74 GB/s, without 27.24 / 25.71. The K-quant tiles (Q4_K, Q6_K)
# do more arithmetic a byte and stream faster without it, which the hardware prefetchers keep up with:
# Q4_K 19.04 -> 21.68 and 18.01 -> 21.85 GB/s, Q6_K 27.60 -> 29.76 and 24.53 -> 25.84 (Qwen2.5-Coder
# 1.5B tg64, 4 pairs alternated: 25.4 -> 27.6 t/s). An earlier VM measured Q4_K the other way (13.6 ->
# 27.8 GB/s with it), so re-measure on a new machine. Tiles of 4+ tokens are compute-bound and do not
# prefetch.
PREFETCH_BYTES = 1024


@intrinsic
def _prefetch(typingctx, array, at):  # type: ignore[no-untyped-def]
    """Hint the cache line holding array[at] into L1 (llvm.prefetch; never faults, even past the end)."""

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        index = context.cast(builder, args[1], sig.args[1], types.intp)
        ptr = _vector_at(context, builder, sig.args[0], args[0], index, ir.IntType(8))
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32]), "llvm.prefetch.p0"
        )
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(array, at), codegen


def _int16_pairs(builder, low, high):  # type: ignore[no-untyped-def]
    """int32 lanes holding (low, high) as two int16."""
    return builder.or_(builder.and_(low, _splat(0xFFFF)), builder.shl(high, _splat(16)))


def _register_sums(n_tok: int, n_steps: int, weight_pairs, chains: int = 1):  # type: ignore[no-untyped-def]
    """An intrinsic computing, for a tile of n_tok tokens and 32 rows, sums[t * 32 + r] = the sum over
    n_steps steps of vpdpwssd(weight pairs of the step, activation pair xp[row0 + t, col0 + step]),
    its accumulators held in registers and written once (LLVM keeps a stack tile in memory). With few
    tokens the steps alternate between `chains` accumulators, added at the end (integers: the same
    sums), so that vpdpwssd's latency is not one long dependency chain."""

    @intrinsic
    def register_sums(typingctx, sums, packed, packed_at, xp, row0, col0):  # type: ignore[no-untyped-def]
        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            sums_type, packed_type, _, xp_type, _, _ = sig.args
            i64 = ir.IntType(64)
            at0, row, col = (context.cast(builder, args[i], sig.args[i], types.intp) for i in (2, 4, 5))
            xp_array = context.make_array(xp_type)(context, builder, args[3])
            acc = [[[_splat(0) for _ in range(chains)] for _ in (0, 1)] for _ in range(n_tok)]
            for step in range(n_steps):
                weights = [
                    weight_pairs(context, builder, packed_type, args[1], at0, step, lane) for lane in (0, 1)
                ]
                for t in range(n_tok):
                    index = [builder.add(row, ir.Constant(i64, t)), builder.add(col, ir.Constant(i64, step))]
                    x_ptr = cgutils.get_item_pointer(
                        context, builder, xp_type, xp_array, index, wraparound=False
                    )
                    x = _broadcast(builder, builder.load(x_ptr))
                    for lane in (0, 1):
                        chain = acc[t][lane]
                        chain[step % chains] = simd.dot_pairs(builder, chain[step % chains], weights[lane], x)
            for t in range(n_tok):
                for lane in (0, 1):
                    total = acc[t][lane][0]
                    for partial in acc[t][lane][1:]:
                        total = builder.add(total, partial)
                    at = ir.Constant(i64, t * ROWS + lane * 16)
                    builder.store(
                        total, _vector_at(context, builder, sums_type, args[0], at, _V16I32), align=4
                    )
            return context.get_dummy_value()

        return types.void(sums, packed, packed_at, xp, row0, col0), codegen

    return register_sums


def _int8_pairs(context, builder, packed_type, packed, at0, step: int, lane: int):  # type: ignore[no-untyped-def]
    """Q8_0 layout, positions 2 * step and 2 * step + 1: the int8 quants of 16 rows, paired."""
    first, second = (
        _widen_bytes16(
            context,
            builder,
            packed_type,
            packed,
            builder.add(at0, ir.Constant(ir.IntType(64), at)),
            signed=True,
        )
        for at in ((2 * step) * ROWS + lane * 16, (2 * step + 1) * ROWS + lane * 16)
    )
    return _int16_pairs(builder, first, second)


# Tiles of the 4-bit layout, every size: vpdpbusd multiplies 4 unsigned weight bytes of
# one row by 4 signed activation bytes and adds the 4 products to the row's int32 lane: 64 multiply-adds
# an instruction where vpdpwssd does 32 and the int16 path 32 in two. Its 4 bytes must be 4 positions of
# one row, and the packed layout keeps the 32 rows of a position together, so 4 positions (128 bytes,
# two loads) are transposed in registers by one byte shuffle per 16 rows (vpermt2b on AVX512-VBMI).
# Integer sums: the same half-block sums as the int16 path, bit for bit.
_V64I8 = ir.VectorType(ir.IntType(8), 64)
# Shuffle of (positions p, p + 1 | positions p + 2, p + 3), 32 row bytes each: byte 4r + k of lane L's
# vector is position p + k of row 16L + r.
_QUAD_MASKS = [
    ir.Constant(
        ir.VectorType(ir.IntType(32), 64), [32 * k + lane * 16 + r for r in range(16) for k in range(4)]
    )
    for lane in (0, 1)
]


def _transposed_quads(context, builder, packed_type, packed, at0, positions, masks=_QUAD_MASKS):  # type: ignore[no-untyped-def]
    """Per 16-row lane, 4 bytes a row: those of `positions` (each the start of 64 bytes: 2 x 32 rows).
    masks None: the bytes are stored so already (Q4_K's records), each 64 bytes one lane."""
    first, second = (
        builder.load(
            _vector_at(
                context,
                builder,
                packed_type,
                packed,
                builder.add(at0, ir.Constant(ir.IntType(64), at)),
                _V64I8,
            ),
            align=1,
        )
        for at in positions
    )
    if masks is None:
        return [first, second]
    return [builder.shuffle_vector(first, second, masks[lane]) for lane in (0, 1)]


def _bytes(value: int | list[int]):  # type: ignore[no-untyped-def]
    return ir.Constant(_V64I8, value if isinstance(value, list) else [value] * 64)


def _nibble_quads(context, builder, packed_type, packed, at0, q: int, masks=_QUAD_MASKS):  # type: ignore[no-untyped-def]
    """Positions 4q .. 4q + 3 after at0, per 16-row lane: (low nibbles, high nibbles), 4 bytes a row."""
    out = []
    for rows in _transposed_quads(
        context, builder, packed_type, packed, at0, ((4 * q) * ROWS, (4 * q + 2) * ROWS), masks
    ):
        low = builder.and_(rows, _bytes(15))
        high = builder.lshr(rows, _bytes(4))
        out.append(tuple(builder.bitcast(v, _V16I32) for v in (low, high)))
    return out


def _q6k_row_quads(context, builder, packed_type, packed, at0, high_type, high, high_at0, q: int):  # type: ignore[no-untyped-def]
    """Q6_K positions 4q .. 4q + 3, per 16-row lane: (unsigned 6-bit weights j, unsigned 6-bit weights
    j + 16), 4 bytes a row, from Q6_K in row quads (engine/cpu/records.py): the nibble bytes stored as
    _transposed_quads leaves them, and one 64-byte qh vector whose bit pairs 0-1, 2-3, 4-5, 6-7 are the
    top bits of (lane 0, weights j), (lane 0, j + 16), (lane 1, j), (lane 1, j + 16): each moved to bits
    4-5 with one shift and one mask, no shuffle."""
    quads = _transposed_quads(
        context, builder, packed_type, packed, at0, ((4 * q) * ROWS, (4 * q + 2) * ROWS), masks=None
    )
    tops_at = builder.add(high_at0, ir.Constant(ir.IntType(64), q * 2 * ROWS))
    h = builder.load(_vector_at(context, builder, high_type, high, tops_at, _V64I8), align=1)
    out = []
    for lane, rows in enumerate(quads):
        pair = []
        for part, nibbles in enumerate((builder.and_(rows, _bytes(15)), builder.lshr(rows, _bytes(4)))):
            pair_at = 2 * (2 * lane + part)  # the bit pair's place in the byte
            tops = builder.shl(h, _bytes(4 - pair_at)) if pair_at <= 4 else builder.lshr(h, _bytes(2))
            weights = builder.or_(nibbles, builder.and_(tops, _bytes(0x30)))
            pair.append(builder.bitcast(weights, _V16I32))
        out.append(tuple(pair))
    return out


def _broadcast_at(context, builder, xb_type, xb_array, row, col):  # type: ignore[no-untyped-def]
    """xb[row, col] (an int32) in all 16 lanes."""
    ptr = cgutils.get_item_pointer(context, builder, xb_type, xb_array, [row, col], wraparound=False)
    return _broadcast(builder, builder.load(ptr))


def _store_chains(context, builder, sums_type, sums, acc) -> None:  # type: ignore[no-untyped-def]
    """sums[t * 32 + 16 * lane:][:16] = the sum of acc[t][lane]'s chains."""
    for t, per_lane in enumerate(acc):
        for lane, chains in enumerate(per_lane):
            total = chains[0]
            for partial in chains[1:]:
                total = builder.add(total, partial)
            at = ir.Constant(ir.IntType(64), t * ROWS + lane * 16)
            builder.store(total, _vector_at(context, builder, sums_type, sums, at, _V16I32), align=4)


def _quad_sums(n_tok: int, chains: int):  # type: ignore[no-untyped-def]
    """An intrinsic computing half a 4-bit block's sums for a tile of n_tok tokens and 32 rows:
    sums[t * 32 + r] = sum over positions j < 8 of w[r, j] * x[t, j] + w[r, j + 16] * x[t, j + 16], where
    xb[row0 + t, col0 + q] holds the 4 int8 activations x[4q .. 4q + 3] and xb[., col0 + 4 + q] those
    16 positions on. Integer sums, so the `chains` accumulators that break vpdpbusd's latency chain
    change nothing."""

    @intrinsic
    def quad_sums(typingctx, sums, packed, packed_at, xb, row0, col0):  # type: ignore[no-untyped-def]
        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            sums_type, packed_type, _, xb_type, _, _ = sig.args
            at0, row, col = (context.cast(builder, args[i], sig.args[i], types.intp) for i in (2, 4, 5))
            quads = [_nibble_quads(context, builder, packed_type, args[1], at0, q) for q in (0, 1)]
            acc = _dpbusd_quads(
                context, builder, n_tok, chains, quads, xb_type, args[3], row, col, max_weight=15
            )
            _store_chains(context, builder, sums_type, args[0], acc)
            return context.get_dummy_value()

        return types.void(sums, packed, packed_at, xb, row0, col0), codegen

    return quad_sums


def _plus(builder, value, n: int):  # type: ignore[no-untyped-def]
    return builder.add(value, ir.Constant(ir.IntType(64), n))


def _dpbusd_quads(
    context,
    builder,
    n_tok: int,
    chains: int,
    quads,
    xb_type,
    xb,
    row,
    col,
    signed=False,
    max_weight=127,
    parts=(0, 1),
):  # type: ignore[no-untyped-def]
    """acc[t][lane] (`chains` partial sums): vpdpbusd of quads[q][lane] = (unsigned bytes of positions
    4q.., of 16 + 4q..; signed bytes with `signed`, simd.dot_signed) with the activations
    xb[row + t, col + q] and xb[row + t, col + q + 4] (only `parts` of the two). Weights up to
    max_weight let AVX2 add several products in int16 before widening them (simd.word_budget)."""
    xb_array = context.make_array(xb_type)(context, builder, xb)
    dot = simd.dot_signed if signed else simd.dot_unsigned
    # AVX2 adds the int16 pair sums of `group` consecutive products before one widening: for tiles of 1
    # and 2 tokens as many as fit (simd.word_budget: Q4_K's whole block), each token's sums live across
    # the group; for 4 tokens pairs of products, one token at a time. Int16 sums for 4 tokens beside
    # their int32 ones would take 32 ymm registers: they spilled, and Qwen2.5-Coder's pp512 ran 0.82x
    # llama.cpp's against 1.03x without them (decode: 0.95x -> 1.14x with them; 2026-12-05,
    # bench_pairs --interleave, 4 rounds each).
    budget = 1 if signed else simd.word_budget(max_weight)
    group = budget if n_tok <= 2 else min(2, budget)
    acc = [[[_splat(0) for _ in range(chains)] for _ in (0, 1)] for _ in range(n_tok)]
    steps = [(q, part) for q in range(len(quads)) for part in parts]
    # ...and for 4 tokens one 16-row lane after the other: the int32 sums of 4 tokens x 32 rows alone
    # fill AVX2's 16 ymm registers.
    for lanes in ((0,), (1,)) if n_tok > 2 and simd.WORD_SUMS else ((0, 1),):
        for first in range(0, len(steps), group):
            chunk = steps[first : first + group]
            chain = (first // group) % chains
            words = [[None, None] for _ in range(n_tok)]
            tokens = range(n_tok)
            order = (
                [(s, t) for s in chunk for t in tokens]
                if n_tok <= 2
                else [(s, t) for t in tokens for s in chunk]
            )
            for (q, part), t in order:
                x = _broadcast_at(
                    context,
                    builder,
                    xb_type,
                    xb_array,
                    _plus(builder, row, t),
                    _plus(builder, col, q + 4 * part),
                )
                for lane in lanes:
                    c = acc[t][lane]
                    if group == 1:
                        c[chain] = dot(builder, c[chain], quads[q][lane][part], x)
                        continue
                    words[t][lane] = simd.word_dot(builder, words[t][lane], quads[q][lane][part], x)
                    if (q, part) == chunk[-1]:
                        c[chain] = simd.widen_words(builder, c[chain], words[t][lane])
    return acc


def _chain_totals(builder, acc):  # type: ignore[no-untyped-def]
    """acc[t][lane] (a list of chains) -> their sums."""
    totals = []
    for per_lane in acc:
        row = []
        for chains in per_lane:
            total = chains[0]
            for partial in chains[1:]:
                total = builder.add(total, partial)
            row.append(total)
        totals.append(row)
    return totals


def _store_rows(context, builder, array_type, array, at, t: int, lane: int, value) -> None:  # type: ignore[no-untyped-def]
    """array[at + t * 32 + 16 * lane :][:16] = value (16 int32)."""
    index = builder.add(at, ir.Constant(ir.IntType(64), t * ROWS + lane * 16))
    builder.store(value, _vector_at(context, builder, array_type, array, index, _V16I32), align=4)


def _scaled_block_sums(context, builder, n_tok, chains, quads, xb_type, xb, row, col, sc, out, max_weight):  # type: ignore[no-untyped-def]
    """The body of _q4k_block_sums and _q5k_block_sums: quads[q] are positions 4q.. and 16 + 4q.. per
    16-row lane (unsigned bytes, 4 a row), sc = (type, array, at), out = (type, array, at)."""
    acc = _dpbusd_quads(context, builder, n_tok, chains, quads, xb_type, xb, row, col, max_weight=max_weight)
    sc_type, sc_array, sc_at = sc
    scales = [
        _widen_bytes16(context, builder, sc_type, sc_array, _plus(builder, sc_at, 16 * lane), signed=False)
        for lane in (0, 1)
    ]
    for t, per_lane in enumerate(_chain_totals(builder, acc)):
        for lane, total in enumerate(per_lane):
            _store_rows(context, builder, out[0], out[1], out[2], t, lane, builder.mul(total, scales[lane]))


def _q4k_block_sums(n_tok: int, chains: int):  # type: ignore[no-untyped-def]
    """Q4_K's whole block b for n_tok tokens and 32 rows, scaled in integers: out[out_at + t * 32 + r] =
    sc[sc_at + r] x sum over the 16 positions j of w[r, j] * x[t, j] + w[r, j + 16] * x[t, j + 16]
    (xb as in _quad_sums, col0 = 8b), from Q4_K's records (records.py), whose nibble bytes are stored as
    _transposed_quads' shuffle would leave them. The scale multiply is here, on whole vectors: written in
    the tile as a lane loop over a (block, token, row) array, LLVM scalarized it (32 imul a block at T =
    1)."""

    @intrinsic
    def block_sums(typingctx, out, out_at, packed, packed_at, xb, row0, col0, sc, sc_at):  # type: ignore[no-untyped-def]
        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            out_type, _, packed_type, _, xb_type, _, _, sc_type, _ = sig.args
            out_at, at0, row, col, sc_at = (
                context.cast(builder, args[i], sig.args[i], types.intp) for i in (1, 3, 5, 6, 8)
            )
            quads = [_nibble_quads(context, builder, packed_type, args[2], at0, q, None) for q in range(4)]
            sc = (sc_type, args[7], sc_at)
            out = (out_type, args[0], out_at)
            _scaled_block_sums(
                context, builder, n_tok, chains, quads, xb_type, args[4], row, col, sc, out, 15
            )
            return context.get_dummy_value()

        return types.void(out, out_at, packed, packed_at, xb, row0, col0, sc, sc_at), codegen

    return block_sums


_V32I8 = ir.VectorType(ir.IntType(8), 32)
# Q5_0/Q5_1/Q5_K's qh byte c of a block and row holds the fifth bits of positions 4c + k (bit 2k) and
# 16 + 4c + k (bit 2k + 1). Spread to the 4 bytes of its row (byte 4r + k of a 16-row lane),
# vpmultishiftqb moves bit 2k (2k + 1) of byte 4r + k to bit 4 of that byte: per byte, the 8 bits of its
# qword from bit offset 8p + 2k - 4 (- 3), p the byte's place in the qword.
_ROW_BYTES = [
    ir.Constant(ir.VectorType(ir.IntType(32), 64), [16 * lane + r for r in range(16) for _ in range(4)])
    for lane in (0, 1)
]
_FIFTH_SHIFTS = [_bytes([(8 * (j % 8) + 2 * (j % 4) - 4 + high) % 64 for j in range(64)]) for high in (0, 1)]


def _fifth_bits(context, builder, qh_type, qh, qh_at0, q: int):  # type: ignore[no-untyped-def]
    """The fifth bits of positions 4q .. 4q + 3 and 16 + 4q .. (qh bytes from qh_at0: Q5_0, Q5_1, Q5_K),
    at bit 4 of each byte, per 16-row lane."""
    at = builder.add(qh_at0, ir.Constant(ir.IntType(64), q * ROWS))
    raw = builder.load(_vector_at(context, builder, qh_type, qh, at, _V32I8), align=1)
    out = []
    for lane in (0, 1):
        rows = builder.shuffle_vector(raw, raw, _ROW_BYTES[lane])
        out.append(tuple(_bit_to_4(builder, rows, high) for high in (0, 1)))
    return out


def _bit_to_4(builder, rows, high: int):  # type: ignore[no-untyped-def]
    """Bit 2k + high of byte 4r + k, moved to bit 4 (the others cleared)."""
    if simd.TARGET.vbmi:
        shift = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_V64I8, [_V64I8, _V64I8]), "llvm.x86.avx512.pmultishift.qb.512"
        )
        return builder.and_(builder.call(shift, [_FIFTH_SHIFTS[high], rows]), _bytes(0x10))
    bits = None
    for k in range(4):
        bit = 2 * k + high
        moved = builder.shl(rows, _bytes(4 - bit)) if bit < 4 else builder.lshr(rows, _bytes(bit - 4))
        part = builder.and_(moved, _bytes([0x10 if j % 4 == k else 0 for j in range(64)]))
        bits = part if bits is None else builder.or_(bits, part)
    return bits


def _q5k_block_sums(n_tok: int, chains: int):  # type: ignore[no-untyped-def]
    """_q4k_block_sums for Q5_K: the nibbles with their fifth bits (qh bytes at qh_at) are the unsigned
    5-bit weights; sc x their sum is the int16 path's sc x (sum of (q - 16) x + 16 sum(x)) exactly."""

    @intrinsic
    def block_sums(typingctx, out, out_at, packed, packed_at, qh, qh_at, xb, row0, col0, sc, sc_at):  # type: ignore[no-untyped-def]
        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            out_type, _, packed_type, _, qh_type, _, xb_type, _, _, sc_type, _ = sig.args
            out_at, at0, qh_at0, row, col, sc_at = (
                context.cast(builder, args[i], sig.args[i], types.intp) for i in (1, 3, 5, 7, 8, 10)
            )
            quads = [
                _five_bit_quads(context, builder, packed_type, args[2], at0, qh_type, args[4], qh_at0, q)
                for q in range(4)
            ]
            sc = (sc_type, args[9], sc_at)
            out = (out_type, args[0], out_at)
            _scaled_block_sums(
                context, builder, n_tok, chains, quads, xb_type, args[6], row, col, sc, out, 31
            )
            return context.get_dummy_value()

        return types.void(out, out_at, packed, packed_at, qh, qh_at, xb, row0, col0, sc, sc_at), codegen

    return block_sums


def _five_bit_quads(context, builder, packed_type, packed, at0, qh_type, qh, qh_at0, q: int):  # type: ignore[no-untyped-def]
    """The unsigned 5-bit weights of quad q (Q5_0, Q5_1, Q5_K), per 16-row lane: (positions 4q..,
    16 + 4q..), the nibbles at at0 with their fifth bits from the qh bytes at qh_at0."""
    nibbles = _nibble_quads(context, builder, packed_type, packed, at0, q)
    fifths = _fifth_bits(context, builder, qh_type, qh, qh_at0, q)
    return [
        tuple(builder.or_(v, builder.bitcast(f, _V16I32)) for v, f in zip(lane, bits, strict=True))
        for lane, bits in zip(nibbles, fifths, strict=True)
    ]


def _q5_weights(context, builder, sig, args, at0, qh_at0, q: int):  # type: ignore[no-untyped-def]
    """_five_bit_quads in _centred_half_sums' argument order (packed args[1], qh args[3])."""
    return _five_bit_quads(context, builder, sig.args[1], args[1], at0, sig.args[3], args[3], qh_at0, q)


# IQ4's levels as weight bytes: + 128 where VNNI's unsigned product takes them (simd.SIGNED_BY_OFFSET).
IQ4_OFFSET_BITS = 7 if simd.SIGNED_BY_OFFSET else 0
_IQ4_LEVEL_BYTES = _bytes(
    [(int(IQ4_LEVELS[i % 16]) + (1 << IQ4_OFFSET_BITS if IQ4_OFFSET_BITS else 0)) % 256 for i in range(64)]
)


def _iq4_weights(context, builder, sig, args, at0, qh_at0, q: int):  # type: ignore[no-untyped-def]
    """IQ4's level bytes of quad q (_IQ4_LEVEL_BYTES), per 16-row lane: one vpshufb per nibble vector."""
    out = []
    for lane in _nibble_quads(context, builder, sig.args[1], args[1], at0, q):
        levels = [simd.byte_lookup(builder, _IQ4_LEVEL_BYTES, builder.bitcast(v, _V64I8)) for v in lane]
        out.append(tuple(builder.bitcast(v, _V16I32) for v in levels))
    return out


def _centred_half_sums(n_tok: int, chains: int, weights, offset_bits: int):  # type: ignore[no-untyped-def]
    """Half a block (positions 8h .. 8h + 7 and 16 + 8h ..) of a Q4_0-layout format whose unsigned
    weight bytes are u = w + 2^offset_bits, for n_tok tokens and 32 rows: sums[t * 32 + r] = sum of
    w[r, j] * x[t, j] over the half = sum of u * x - 2^offset_bits * xh[row0 + t, 2b + h], xh the
    half's activation sum (_half_block_sums), xb as in _quad_sums (col0 = 8b + 2h). `weights` gives a
    quad's u per lane (Q5_0/Q5_1: 5-bit weights, w = q - 16; IQ4: levels + 128); `qh` may be any array
    when it does not read one. offset_bits 0: signed weight bytes (simd.dot_signed, AVX2's IQ4). The same
    integers as the int16/int32 paths, so the same outputs."""

    @intrinsic
    def half_sums(typingctx, sums, packed, packed_at, qh, qh_at, xb, row0, col0, xh, half):  # type: ignore[no-untyped-def]
        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            sums_type, _, _, _, _, xb_type, _, _, xh_type, _ = sig.args
            at0, qh_at0, row, col, half = (
                context.cast(builder, args[i], sig.args[i], types.intp) for i in (2, 4, 6, 7, 9)
            )
            xh_array = context.make_array(xh_type)(context, builder, args[8])
            quads = [weights(context, builder, sig, args, at0, qh_at0, q) for q in (0, 1)]
            signed = offset_bits == 0
            acc = _dpbusd_quads(
                context, builder, n_tok, chains, quads, xb_type, args[5], row, col, signed, 31
            )
            for t, per_lane in enumerate(_chain_totals(builder, acc)):
                offset = _broadcast_at(context, builder, xh_type, xh_array, _plus(builder, row, t), half)
                for lane, total in enumerate(per_lane):
                    centred = (
                        total if signed else builder.sub(total, builder.shl(offset, _splat(offset_bits)))
                    )
                    at = ir.Constant(ir.IntType(64), t * ROWS + lane * 16)
                    builder.store(
                        centred, _vector_at(context, builder, sums_type, args[0], at, _V16I32), align=4
                    )
            return context.get_dummy_value()

        return types.void(sums, packed, packed_at, qh, qh_at, xb, row0, col0, xh, half), codegen

    return half_sums


def _q6k_block_sums(n_tok: int, chains: int):  # type: ignore[no-untyped-def]
    """Q6_K's whole block b (its 16 positions at `packed_at`, their qh bytes at `qh_at`) for n_tok
    tokens and 32 rows, scaled in integers: out[out_at + t * 32 + r] = sc_lo[r] x (sum over j < 16 of
    u[r, j] * x[t, j] - 32 x16[t, 2b]) + sc_hi[r] x (the same over j + 16, - 32 x16[t, 2b + 1]), where
    u are the unsigned 6-bit weights (q - 32 = u - 32), sc_lo / sc_hi the int8 scales at sc_at and
    sc_at + 32, x16 the activations' sums per 16 and xb as in _quad_sums (col0 = 8b). The weights are in
    row quads (engine/cpu/records.py), the only layout the VNNI tiles read."""

    @intrinsic
    def q6k_sums(typingctx, out, out_at, packed, packed_at, qh, qh_at, xb, row0, col0, sc, sc_at, x16):  # type: ignore[no-untyped-def]
        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            out_type, _, packed_type, _, qh_type, _, xb_type, _, _, sc_type, _, x16_type = sig.args
            out_at, at0, qh_at0, row, col, sc_at = (
                context.cast(builder, args[i], sig.args[i], types.intp) for i in (1, 3, 5, 7, 8, 10)
            )
            x16_array = context.make_array(x16_type)(context, builder, args[11])
            packed, qh = args[2], args[4]
            quads = [
                _q6k_row_quads(context, builder, packed_type, packed, at0, qh_type, qh, qh_at0, q)
                for q in range(4)
            ]
            acc = [  # weights j (the low sums), weights j + 16 (the high sums)
                _dpbusd_quads(
                    context,
                    builder,
                    n_tok,
                    chains,
                    quads,
                    xb_type,
                    args[6],
                    row,
                    col,
                    max_weight=63,
                    parts=(part,),
                )
                for part in (0, 1)
            ]
            scales = [
                [
                    _widen_bytes16(
                        context,
                        builder,
                        sc_type,
                        args[9],
                        _plus(builder, sc_at, 32 * part + 16 * lane),
                        signed=True,
                    )
                    for lane in (0, 1)
                ]
                for part in (0, 1)
            ]
            totals = [_chain_totals(builder, acc[part]) for part in (0, 1)]
            # x16 column of the low sub-block: col0 / 4 (= 2b)
            x16_col = builder.ashr(col, ir.Constant(ir.IntType(64), 2))
            for t in range(n_tok):
                for lane in (0, 1):
                    value = None
                    for part in (0, 1):
                        shift = _broadcast_at(
                            context,
                            builder,
                            x16_type,
                            x16_array,
                            _plus(builder, row, t),
                            _plus(builder, x16_col, part),
                        )
                        centred = builder.sub(totals[part][t][lane], builder.shl(shift, _splat(5)))
                        scaled = builder.mul(centred, scales[part][lane])
                        value = scaled if value is None else builder.add(value, scaled)
                    _store_rows(context, builder, out_type, args[0], out_at, t, lane, value)
            return context.get_dummy_value()

        return types.void(out, out_at, packed, packed_at, qh, qh_at, xb, row0, col0, sc, sc_at, x16), codegen

    return q6k_sums


# Tiles of 8 tokens call the 4-token intrinsics twice (here and for Q4_0/Q4_1, Q4_K, Q8_0): one call
# for 8 keeps 16-32 accumulators live with the shuffled weights, and spills. Two calls of 4 against one
# of 8 (2026-12-03, 2 threads; scripts/ab_matmul.py, both alternated in one process): Q8_0 32768x640
# 0.96-0.97x the time at T = 8-64, Q4_0 and Q4_K 8960x1536 0.94-0.99x at T = 8-256; Q6_K (two
# bench_matmul.py runs, T = 16) 2.48 -> 2.09 ms.
_q6k_block_sums1 = _q6k_block_sums(1, simd.chains(4))
_q6k_block_sums2 = _q6k_block_sums(2, simd.chains(2))
_q6k_block_sums4 = _q6k_block_sums(4, simd.chains(1))
_quad_sums1 = _quad_sums(1, simd.chains(4))
_quad_sums2 = _quad_sums(2, simd.chains(2))
_quad_sums4 = _quad_sums(4, simd.chains(1))
# Whole Q4_K blocks (16 positions) of its records times their scales.
_q4k_record_sums1 = _q4k_block_sums(1, simd.chains(4))
_q4k_record_sums2 = _q4k_block_sums(2, simd.chains(2))
_q4k_record_sums4 = _q4k_block_sums(4, simd.chains(1))
_q5k_block_sums1 = _q5k_block_sums(1, simd.chains(4))
_q5k_block_sums2 = _q5k_block_sums(2, simd.chains(2))
_q5k_block_sums4 = _q5k_block_sums(4, simd.chains(1))
_q5_half_sums1 = _centred_half_sums(1, simd.chains(4), _q5_weights, 4)
_q5_half_sums2 = _centred_half_sums(2, simd.chains(2), _q5_weights, 4)
_q5_half_sums4 = _centred_half_sums(4, 1, _q5_weights, 4)
_iq4_quad_sums1 = _centred_half_sums(1, simd.chains(4), _iq4_weights, IQ4_OFFSET_BITS)
_iq4_quad_sums2 = _centred_half_sums(2, simd.chains(2), _iq4_weights, IQ4_OFFSET_BITS)
_iq4_quad_sums4 = _centred_half_sums(4, 1, _iq4_weights, IQ4_OFFSET_BITS)

# A Q8_0 block (16 position pairs) for tiles of 1 and 2 tokens, where vpdpwssd sums held in memory were
# latency-bound (2.4x slower than the float path at T = 1).
_q8_block_sums1 = _register_sums(1, 16, _int8_pairs, chains=simd.chains(4))
_q8_block_sums2 = _register_sums(2, 16, _int8_pairs, chains=simd.chains(2))


def _q8_quad_sums(n_tok: int):  # type: ignore[no-untyped-def]
    """An intrinsic computing a Q8_0 block's sums for a tile of n_tok tokens and 32 rows on vpdpbusd:
    sums[t * 32 + r] = sum over the 32 positions j of w[r, j] * x[t, j], with xb as in _quad_sums
    (col0 = 8b) and xs[row0 + t, b] the block's activation sum. vpdpbusd wants unsigned weight bytes:
    it multiplies w + 128 (the sign bit flipped), and 128 x sum(x) comes off at the end (AVX2: the
    signed bytes as they are, simd.dot_signed). Integers, so the same sums as the vpdpwssd tiles of 1
    and 2 tokens to the bit."""

    @intrinsic
    def q8_quad_sums(typingctx, sums, packed, packed_at, xb, xs, row0, b):  # type: ignore[no-untyped-def]
        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            sums_type, packed_type, _, xb_type, xs_type, _, _ = sig.args
            at0, row, block = (context.cast(builder, args[i], sig.args[i], types.intp) for i in (2, 5, 6))
            col = builder.shl(block, ir.Constant(ir.IntType(64), 3))
            xb_array = context.make_array(xb_type)(context, builder, args[3])
            xs_array = context.make_array(xs_type)(context, builder, args[4])
            offset = simd.SIGNED_BY_OFFSET
            dot = simd.dot_unsigned if offset else simd.dot_signed
            acc = [[[_splat(0)] for _ in (0, 1)] for _ in range(n_tok)]
            for q in range(QK // 4):
                quads = _transposed_quads(
                    context, builder, packed_type, args[1], at0, ((4 * q) * ROWS, (4 * q + 2) * ROWS)
                )
                lanes = [
                    builder.bitcast(builder.xor(rows, _bytes(0x80)) if offset else rows, _V16I32)
                    for rows in quads
                ]
                for t in range(n_tok):
                    x = _broadcast_at(
                        context, builder, xb_type, xb_array, _plus(builder, row, t), _plus(builder, col, q)
                    )
                    for lane in (0, 1):
                        acc[t][lane][0] = dot(builder, acc[t][lane][0], lanes[lane], x)
            for t in range(n_tok if offset else 0):
                offset = _broadcast_at(context, builder, xs_type, xs_array, _plus(builder, row, t), block)
                for lane in (0, 1):
                    acc[t][lane][0] = builder.sub(acc[t][lane][0], builder.shl(offset, _splat(7)))
            _store_chains(context, builder, sums_type, args[0], acc)
            return context.get_dummy_value()

        return types.void(sums, packed, packed_at, xb, xs, row0, b), codegen

    return q8_quad_sums


# Tiles of 4 and 8 tokens: vpdpbusd does twice vpdpwssd's multiplies per instruction, and the sums stay
# in registers. Against the vpdpwssd sums held in memory they replaced (scripts/ab_matmul.py --rev
# 75fecee, 32768x512, 2 threads, 2026-12-03): 0.84x the time at T = 8 and 16, 0.69x at T = 64.
_q8_quad_sums4 = _q8_quad_sums(4)


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


# ---------------------------------------------------------------------------------------------------
# Activations: per 32-block, int8 values (stored as int16), the scale and the sum of the block.


@njit(**_EXACT)
def _round_f16(x: np.float32) -> np.float32:
    """x rounded to the nearest float16 (ties to even), as ggml stores its q8 activation scales."""
    return f16_to_f32(float_to_half(x))


@njit(**_EXACT)
def _quantize_row(x: np.ndarray, t: int, q8_1: bool, xq: np.ndarray, xd: np.ndarray, xs: np.ndarray) -> None:
    """llama.cpp's q8_0 (q8_1 with `q8_1`) blocks of row t: its rounding, scales and sums exactly.

    The scale d = amax / 127 is stored as float16 as ggml stores it: a float32 d (Llamba's first
    version) moved each output ~1e-4, which the next layers' int8 roundings amplified to 1.3% of the
    logits of a 2-layer synthetic model (scripts/make_quant_goldens.py; with float16 d: 1e-7).
    """
    for b in range(xd.shape[1]):
        amax = F0
        for i in range(QK):
            amax = max(amax, abs(x[t, b * QK + i]))
        scale = amax / np.float32(127.0)
        inv = np.float32(127.0) / amax if amax > F0 else F0
        total = 0
        for i in range(QK):
            q = np.int16(np.rint(x[t, b * QK + i] * inv))
            xq[t, b * QK + i] = q
            total += np.int32(q)
        xd[t, b] = _round_f16(scale)
        # The sum of the quantized values, not of x: the block-minimum term then rounds like the
        # quant term. q8_0 (Q4_0's -8) multiplies the integer sum by the stored d; q8_1 stores
        # d * sum as float16 (with d before its rounding).
        if q8_1:
            xs[t, b] = _round_f16(scale * np.float32(total))
        else:
            xs[t, b] = xd[t, b] * np.float32(total)


@njit(**_EXACT)
def first_largest(x: np.ndarray, t: int, start: int, n: int) -> int:
    """i of the first value x[t, start + i] (i < n) of the largest magnitude (np.argmax(np.abs(...)));
    x without NaN.

    On the float32 bits with the sign cleared, whose integer order is the magnitudes' order: an integer
    max reduction vectorizes where the float compare-and-keep scan did not. q8_K of 8960 activations
    (Qwen2.5-Coder's ffn_down input, one thread, `_quantize` as the kernels call it): 6.7 -> 4.4 us, the
    same bytes out."""
    bits = x[t, start : start + n].view(np.int32)
    largest = np.int32(0)
    for i in range(n):
        largest = max(largest, bits[i] & 0x7FFFFFFF)
    for i in range(n):
        if bits[i] & 0x7FFFFFFF == largest:
            return i
    return 0


@njit(**_EXACT)
def _quantize_row_k(x: np.ndarray, t: int, xq: np.ndarray, xd: np.ndarray, xs: np.ndarray) -> None:
    """llama.cpp's q8_K of row t (the activations of its K-quant and IQ4_XS dot products): one float32
    scale per 256, from the first largest-magnitude value v (scale -127 / v, so v becomes -127), with
    its rounding; stored per 32-block as the kernels read it (the scale repeated, the block's sum)."""
    for sb in range(xd.shape[1] // 8):
        base = sb * 8 * QK
        vmax = x[t, base + first_largest(x, t, base, 8 * QK)]
        amax = abs(vmax)
        iscale = np.float32(-127.0) / vmax if amax > F0 else F0
        d = np.float32(1.0) / iscale if amax > F0 else F0
        for b in range(sb * 8, sb * 8 + 8):
            total = 0
            for i in range(QK):
                q = np.int16(min(np.rint(iscale * x[t, b * QK + i]), np.float32(127.0)))
                xq[t, b * QK + i] = q
                total += np.int32(q)
            xd[t, b] = d
            xs[t, b] = d * np.float32(total)


@njit(**_EXACT)
def _quantize_rows(x: np.ndarray, t: int, kind: int, xq: np.ndarray, xd: np.ndarray, xs: np.ndarray) -> None:
    if kind == ACT_Q8_K:
        _quantize_row_k(x, t, xq, xd, xs)
    else:
        _quantize_row(x, t, kind == ACT_Q8_1, xq, xd, xs)


@njit(**_EXACT)
def _quantize_serial(x: np.ndarray, kind: int, xq: np.ndarray, xd: np.ndarray, xs: np.ndarray) -> None:
    for t in range(x.shape[0]):
        _quantize_rows(x, t, kind, xq, xd, xs)


@njit(parallel=True, **_EXACT)
def _quantize_parallel(x: np.ndarray, kind: int, xq: np.ndarray, xd: np.ndarray, xs: np.ndarray) -> None:
    for t in prange(x.shape[0]):
        _quantize_rows(x, t, kind, xq, xd, xs)


@njit(**_EXACT)
def _quantize(x: np.ndarray, kind: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """int8 activations (held as int16), their scale and block sums per 32-block, in the q8 kind
    (ACT_Q8_0, ACT_Q8_1, ACT_Q8_K) llama.cpp pairs with the weight type."""
    n_tok, k = x.shape
    xq = np.empty((n_tok, k), np.int16)
    xd = np.empty((n_tok, k // QK), np.float32)
    xs = np.empty((n_tok, k // QK), np.float32)
    if n_tok >= PARALLEL_QUANTIZE_TOKENS:
        _quantize_parallel(x, kind, xq, xd, xs)
    else:
        _quantize_serial(x, kind, xq, xd, xs)
    return xq, xd, xs


def quantize_activations(x: np.ndarray, kind: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(xq int16 (T, K), scale (T, K/32), block sums (T, K/32)): what the kernels see, for a q8 kind."""
    return _quantize(np.ascontiguousarray(x, dtype=np.float32), kind)


# ---------------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------------
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
    _store_tile(acc, out, g, t0, n_tok)


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
    _store_tile(acc, out, g, t0, n_tok)


@njit(**_KERNEL)
def _activation_quads(xq: np.ndarray) -> np.ndarray:
    """int32 holding the int8 activations x[4i .. 4i + 3] as bytes 0..3: vpdpbusd's broadcast operand."""
    n_tok, k = xq.shape
    xb = np.empty((n_tok, k // 4), np.int32)
    for t in range(n_tok):
        for i in range(k // 4):
            v = np.int64(0)
            for c in range(4):
                v |= (np.int64(xq[t, 4 * i + c]) & 0xFF) << (8 * c)
            xb[t, i] = v
    return xb


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


# ---------------------------------------------------------------------------------------------------
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


@njit(inline="always")
def _k_superblock(acc, blocks, d, m, mn, with_min, xd, xsum, g, sb, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """acc += d * xd * sum_b blocks[b] (- dmin * xd * sum_b mn[b] * xsum[b] `with_min`) for super-block
    sb of row group g; blocks[b, t, r] = scale x integer sum of block sb * 8 + b, token t0 + t, row r.
    One function for every tile and both paths, so a token's output does not depend on its tile."""
    dq, mq = _lanes(d, g, sb), _lanes(m, g, sb)
    _k_superblock_lanes(acc, blocks, dq, mq, mn[g], sb * 8 * ROWS, ROWS, with_min, xd, xsum, sb, t0, n_tok)


@njit(inline="always")
def _k_superblock_lanes(acc, blocks, dq, mq, mn_g, mn_at, mn_step, with_min, xd, xsum, sb, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """_k_superblock on the group's 32 d and dmin lanes, the mins of block sb * 8 + bb at mn_g[mn_at +
    bb * mn_step:] (the field arrays and Q4_K's records, engine/cpu/records.py, place them apart)."""
    for t in range(n_tok):
        xdt = xd[t0 + t, sb * 8]
        for r in range(ROWS):
            isum = np.int32(0)
            for bb in range(8):
                isum = np.int32(isum + blocks[bb, t, r])
            if with_min:
                imin = np.int32(0)
                for bb in range(8):
                    mnr = np.int32(mn_g[mn_at + bb * mn_step + r])
                    imin = np.int32(imin + mnr * xsum[t0 + t, sb * 8 + bb])
                dmin = f16_to_f32(mq[r]) * xdt
                acc[t, r] += f16_to_f32(dq[r]) * xdt * np.float32(isum) - dmin * np.float32(imin)
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
    _store_tile(acc, out, g, t0, n_tok)


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


@njit(**_KERNEL)
def _activation_sums32(xq: np.ndarray) -> np.ndarray:
    """The integer sum of each 32-block of int8 activations (the K-quants' mins go through them)."""
    n_tok, k = xq.shape
    out = np.empty((n_tok, k // QK), np.int32)
    for t in range(n_tok):
        for b in range(k // QK):
            total = 0
            for i in range(QK):
                total += np.int32(xq[t, b * QK + i])
            out[t, b] = total
    return out


@njit(parallel=True, **_KERNEL)
def _matmul_q4_k(x, qs, d, m, sc, mn, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, _ = _quantize(x, ACT_Q8_K)
    a = (qs, d, m, sc, mn, xq, xd, _activation_sums32(xq), out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _q4k_tile, a, _q4k_tile, a, g)


@njit(inline="always")
def _q4k_record_tile(a, g, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
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
        _k_superblock_lanes(acc, blocks, dq, mq, mn[g], sb * 8 * ROWS, ROWS, True, xd, xsum, sb, t0, n_tok)
    _store_tile(acc, out, g, t0, n_tok)


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


# ---------------------------------------------------------------------------------------------------
# Q5_0: low nibbles as the 4-bit layout; fifth bits of positions (j, j + 16) in qh byte j // 4 of the
# block, bits 2 * (j % 4) and 2 * (j % 4) + 1. Weights are q - 16: half a block is 16 products of at
# most 16 * 127 per lane, which fits int16.


@njit(inline="always")
def _q5_position(s16, qs, wh, shift, xq, g, b, j, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """s16 += weights (j, j + 16) of block b times their activations. Callers pass `shift` as a
    literal: with a variable shift LLVM cannot narrow the lanes and computes in int64 (4x slower)."""
    wq = _lanes(qs, g, b * 16 + j)
    for t in range(n_tok):
        xlo = xq[t0 + t, b * QK + j]
        xhi = xq[t0 + t, b * QK + j + 16]
        for r in range(ROWS):
            v = wq[r]
            h = wh[r] >> shift
            lo = np.int16((v & 15) | ((h & 1) << 4)) - np.int16(16)
            hi = np.int16((v >> 4) | ((h & 2) << 3)) - np.int16(16)
            s16[t, r] += lo * xlo + hi * xhi


@njit(inline="always")
def _q5_tile(a, g, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """Q5_0, and Q5_1 when `with_min`: its w = d*q + m summed as d*(q - 16) + (16*d*sum(x) + m*s),
    with llama.cpp's q8_1 terms (sum(x) from the stored d, s = d * sum(q) rounded to f16)."""
    qs, qh, d, m, with_min, xq, xd, xs, xsum, out = a
    acc = stack_tile_f32()
    s16 = stack_tile_i16()
    _zero_tile(acc, n_tok)
    for b in range(xd.shape[1]):
        dq = _lanes(d, g, b)
        for half in range(2):
            _zero_tile(s16, n_tok)
            for c in range(2 * half, 2 * half + 2):
                wh = _lanes(qh, g, b * 4 + c)
                _q5_position(s16, qs, wh, 0, xq, g, b, 4 * c, t0, n_tok)
                _q5_position(s16, qs, wh, 2, xq, g, b, 4 * c + 1, t0, n_tok)
                _q5_position(s16, qs, wh, 4, xq, g, b, 4 * c + 2, t0, n_tok)
                _q5_position(s16, qs, wh, 6, xq, g, b, 4 * c + 3, t0, n_tok)
            for t in range(n_tok):
                xdt = xd[t0 + t, b]
                for r in range(ROWS):
                    acc[t, r] += f16_to_f32(dq[r]) * xdt * np.float32(s16[t, r])
        if with_min:
            mq = _lanes(m, g, b)
            for t in range(n_tok):
                xst, xsumt = xs[t0 + t, b], xsum[t0 + t, b]
                for r in range(ROWS):
                    acc[t, r] += np.float32(16.0) * f16_to_f32(dq[r]) * xsumt + f16_to_f32(mq[r]) * xst
    _store_tile(acc, out, g, t0, n_tok)


@njit(parallel=True, **_KERNEL)
def _matmul_q5(x, qs, qh, d, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, xs = _quantize(x)
    a = (qs, qh, d, d, False, xq, xd, xs, xs, out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _q5_tile, a, _q5_tile, a, g)


@njit(**_KERNEL)
def _integer_sums(xq: np.ndarray, xd: np.ndarray) -> np.ndarray:
    """d * sum(q) per 32-block with the stored d (q8_0's sum; q8_1's own sum is rounded to f16)."""
    n_tok, nb = xd.shape
    out = np.empty((n_tok, nb), np.float32)
    for t in range(n_tok):
        for b in range(nb):
            total = 0
            for i in range(QK):
                total += np.int32(xq[t, b * QK + i])
            out[t, b] = xd[t, b] * np.float32(total)
    return out


@njit(parallel=True, **_KERNEL)
def _matmul_q5_1(x, qs, qh, d, m, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, xs = _quantize(x, ACT_Q8_1)
    a = (qs, qh, d, m, True, xq, xd, xs, _integer_sums(xq, xd), out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _q5_tile, a, _q5_tile, a, g)


@njit(inline="always")
def _q5_tile_vnni(a, g, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """_q5_tile on vpdpbusd (_q5_half_sums: the same centred half-block sums), the same float steps."""
    qs, qh, d, m, with_min, xb, x16h, xd, xs, xsum, out = a
    acc = stack_tile_f32()
    sums_ptr = _alloca_i32(256)
    sums, flat_sums = carray(sums_ptr, (8, 32)), carray(sums_ptr, (256,))
    qs_g, qh_g = qs[g], qh[g]
    _zero_tile(acc, n_tok)
    for b in range(xd.shape[1]):
        for half in range(2):
            at, qh_at, col, h = (
                (b * 16 + half * 8) * ROWS,
                (b * 4 + half * 2) * ROWS,
                b * 8 + half * 2,
                2 * b + half,
            )
            if n_tok == 8:
                _q5_half_sums4(flat_sums, qs_g, at, qh_g, qh_at, xb, t0, col, x16h, h)
                _q5_half_sums4(flat_sums[128:], qs_g, at, qh_g, qh_at, xb, t0 + 4, col, x16h, h)
            elif n_tok == 4:
                _q5_half_sums4(flat_sums, qs_g, at, qh_g, qh_at, xb, t0, col, x16h, h)
            elif n_tok == 2:
                _q5_half_sums2(flat_sums, qs_g, at, qh_g, qh_at, xb, t0, col, x16h, h)
            else:
                _q5_half_sums1(flat_sums, qs_g, at, qh_g, qh_at, xb, t0, col, x16h, h)
            _q4_add_half(acc, sums, d, g, b, xd, t0, n_tok)
        if with_min:
            dq, mq = _lanes(d, g, b), _lanes(m, g, b)
            for t in range(n_tok):
                xst, xsumt = xs[t0 + t, b], xsum[t0 + t, b]
                for r in range(ROWS):
                    acc[t, r] += np.float32(16.0) * f16_to_f32(dq[r]) * xsumt + f16_to_f32(mq[r]) * xst
    _store_tile(acc, out, g, t0, n_tok)


@njit(**_KERNEL)
def _half_block_sums(xq: np.ndarray) -> np.ndarray:
    """The integer sum of each half block's activations: x[8h .. 8h + 7] and x[16 + 8h ..] of a block."""
    n_tok, k = xq.shape
    out = np.empty((n_tok, 2 * (k // QK)), np.int32)
    for t in range(n_tok):
        for b in range(k // QK):
            for half in range(2):
                total = 0
                for j in range(8):
                    total += np.int32(xq[t, b * QK + half * 8 + j]) + np.int32(
                        xq[t, b * QK + 16 + half * 8 + j]
                    )
                out[t, 2 * b + half] = total
    return out


@njit(parallel=True, **_KERNEL)
def _matmul_q5_vnni(x, qs, qh, d, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, xs = _quantize(x)
    a = (qs, qh, d, d, False, _activation_quads(xq), _half_block_sums(xq), xd, xs, xs, out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _q5_tile_vnni, a, _q5_tile_vnni, a, g)


@njit(parallel=True, **_KERNEL)
def _matmul_q5_1_vnni(x, qs, qh, d, m, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, xs = _quantize(x, ACT_Q8_1)
    a = (qs, qh, d, m, True, _activation_quads(xq), _half_block_sums(xq), xd, xs, _integer_sums(xq, xd), out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _q5_tile_vnni, a, _q5_tile_vnni, a, g)


# ---------------------------------------------------------------------------------------------------
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
    _store_tile(acc, out, g, t0, n_tok)


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
    _store_tile(acc, out, g, t0, n_tok)


@njit(parallel=True, **_KERNEL)
def _matmul_q5k_vnni(x, qs, qh, d, m, sc, mn, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, _ = _quantize(x, ACT_Q8_K)
    a = (qs, qh, d, m, sc, mn, _activation_quads(xq), xd, _activation_sums32(xq), out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _q5k_tile_vnni, a, _q5k_tile_vnni, a, g)


# ---------------------------------------------------------------------------------------------------
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
    _store_tile(acc, out, g, t0, n_tok)


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
    _store_tile(acc, out, g, t0, n_tok)


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


# ---------------------------------------------------------------------------------------------------
# Q3_K and Q2_K: a scale per 16 weights; byte p of a 32-block holds the two-bit quants of weights
# p, p + 8 (first 16-weight sub-block) and p + 16, p + 24 (second), so each sub-block keeps its sum
# (as Q6_K); Q3_K's third bits (of its q + 4) come from qh. 16 products of at most 7 * 127 fit int16.
# The constant part of each weight (Q3_K's -4 * d * sc, Q2_K's -dmin * mn) goes through the 16-weight
# activation sums.


@njit(inline="always")
def _k16_positions(slo, shi, qs, qh, shift, is_q2, xq, g, b, p0, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """Positions p0 .. p0 + 3; `shift` (a literal, see Q5_0) selects their third bits in qh."""
    for p in range(p0, p0 + 4):
        wq = _lanes(qs, g, b * 8 + p)
        wh = _lanes(qh, g, b * 4 + p - p0)
        for t in range(n_tok):
            x0, x1 = xq[t0 + t, b * QK + p], xq[t0 + t, b * QK + p + 8]
            x2, x3 = xq[t0 + t, b * QK + p + 16], xq[t0 + t, b * QK + p + 24]
            for r in range(ROWS):
                if is_q2:
                    u = wq[r]
                    slo[t, r] += np.int16(u & 3) * x0 + np.int16((u >> 2) & 3) * x1
                    shi[t, r] += np.int16((u >> 4) & 3) * x2 + np.int16(u >> 6) * x3
                else:
                    # Q3_K: int16 casts on every step, as in Q6_K; without them its tiles ran 3.4x (T=1)
                    # and 3.2x (T=16) slower. The same casts made Q2_K's 1.4x slower, so it has none.
                    v = np.int16(wq[r])
                    h = np.int16(wh[r] >> shift)
                    c0 = np.int16(np.int16(v & 3) | np.int16((h & 1) << 2))
                    c1 = np.int16(np.int16(np.int16(v >> 2) & 3) | np.int16((h & 2) << 1))
                    c2 = np.int16(np.int16(np.int16(v >> 4) & 3) | np.int16(h & 4))
                    c3 = np.int16(np.int16(v >> 6) | np.int16((h & 8) >> 1))
                    slo[t, r] += c0 * x0 + c1 * x1
                    shi[t, r] += c2 * x2 + c3 * x3


@njit(inline="always")
def _k16_tile(a, g, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    qs, qh, d, m, sc, mn, is_q2, xq, xd, xs16, out = a
    acc = stack_tile_f32()
    slo = stack_tile_i16()
    shi = stack_tile_i16()
    _zero_tile(acc, n_tok)
    for b in range(xd.shape[1]):
        _zero_tile(slo, n_tok)
        _zero_tile(shi, n_tok)
        _k16_positions(slo, shi, qs, qh, 0, is_q2, xq, g, b, 0, t0, n_tok)
        _k16_positions(slo, shi, qs, qh, 4, is_q2, xq, g, b, 4, t0, n_tok)
        dq, sclo, schi = _lanes(d, g, b >> 3), _lanes(sc, g, 2 * b), _lanes(sc, g, 2 * b + 1)
        for t in range(n_tok):
            xdt = xd[t0 + t, b]
            for r in range(ROWS):
                lo = np.float32(sclo[r]) * np.float32(slo[t, r])
                acc[t, r] += f16_to_f32(dq[r]) * xdt * (lo + np.float32(schi[r]) * np.float32(shi[t, r]))
        if is_q2:
            mq, mnlo, mnhi = _lanes(m, g, b >> 3), _lanes(mn, g, 2 * b), _lanes(mn, g, 2 * b + 1)
            for t in range(n_tok):
                xa, xb = xs16[t0 + t, 2 * b], xs16[t0 + t, 2 * b + 1]
                for r in range(ROWS):
                    acc[t, r] -= f16_to_f32(mq[r]) * (np.float32(mnlo[r]) * xa + np.float32(mnhi[r]) * xb)
        else:
            for t in range(n_tok):
                xa, xb = xs16[t0 + t, 2 * b], xs16[t0 + t, 2 * b + 1]
                for r in range(ROWS):
                    low = np.float32(sclo[r]) * xa + np.float32(schi[r]) * xb
                    acc[t, r] -= np.float32(4.0) * f16_to_f32(dq[r]) * low
    _store_tile(acc, out, g, t0, n_tok)


@njit(**_KERNEL)
def _sums16(xq: np.ndarray, xd: np.ndarray) -> np.ndarray:
    """d * sum(q) per 16 activations (llama.cpp's q8_K bsums, scaled)."""
    n_tok, k = xq.shape
    out = np.empty((n_tok, k // 16), np.float32)
    for t in range(n_tok):
        for h in range(k // 16):
            total = 0
            for i in range(16):
                total += np.int32(xq[t, h * 16 + i])
            out[t, h] = xd[t, h // 2] * np.float32(total)
    return out


@njit(parallel=True, **_KERNEL)
def _matmul_q3k(x, qs, qh, d, sc, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, _ = _quantize(x, ACT_Q8_K)
    a = (qs, qh, d, d, sc, sc, False, xq, xd, _sums16(xq, xd), out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _k16_tile, a, _k16_tile, a, g)


@njit(parallel=True, **_KERNEL)
def _matmul_q2k(x, qs, d, m, sc, mn, out) -> None:  # type: ignore[no-untyped-def]
    xq, xd, _ = _quantize(x, ACT_Q8_K)
    a = (qs, qs, d, m, sc, mn, True, xq, xd, _sums16(xq, xd), out)
    for g in prange(qs.shape[0]):
        _each_tile(xq.shape[0], _k16_tile, a, _k16_tile, a, g)


# ---------------------------------------------------------------------------------------------------
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
    _store_tile(acc, out, g, t0, n_tok)


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
    _store_tile(acc, out, g, t0, n_tok)


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


# ---------------------------------------------------------------------------------------------------
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
    _store_tile(acc, out, g, t0, n_tok)


@njit(inline="always")
def _q8_tile_vnni(a, g, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
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
    _store_tile(acc, out, g, t0, n_tok)


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


# ---------------------------------------------------------------------------------------------------
# Float path: F16, BF16 and F32 weights against the unquantized activations (llama.cpp's F32/F16 types
# take float activations too; BF16 rounds them to bf16 first, _round_to_bf16).


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
                acc[t, r] += to_f32(w0[r]) * x0 + to_f32(w1[r]) * x1
    if n_cols % 2:
        w0 = _lanes(f, g, n_cols - 1)
        for t in range(n_tok):
            x0 = x[t0 + t, n_cols - 1]
            for r in range(ROWS):
                acc[t, r] += to_f32(w0[r]) * x0
    _store_tile(acc, out, g, t0, n_tok)


@njit(inline="always")
def _float_tokens(a, g, t0, n_tok) -> None:  # type: ignore[no-untyped-def]
    """One-token tiles, the float path's small tiles: a 2-token tile's output differed from two 1-token
    tiles' in the last bits (FMA contraction) when loaded from Numba's cache."""
    for t in range(n_tok):
        _float_tile(a, g, t0 + t, 1)


@njit(parallel=True, **_KERNEL)
def _matmul_float(x, f, out) -> None:  # type: ignore[no-untyped-def]
    a = (f, x, out)
    for g in prange(f.shape[0]):
        _each_tile(x.shape[0], _float_tile, a, _float_tokens, a, g)


# ---------------------------------------------------------------------------------------------------
# get_rows: dequantize whole rows out of the interleaved layout (embedding lookup).


@njit(**_KERNEL)
def _rows_q4(ids, qs, d, m, sc, mn, kind, out) -> None:  # type: ignore[no-untyped-def]
    for i in range(ids.shape[0]):
        g, r = ids[i] // ROWS, ids[i] % ROWS
        for b in range(out.shape[1] // QK):
            if kind == KIND_Q4_0:
                scale = f16_to_f32(d[g, b * ROWS + r])
                low = np.float32(-8.0) * scale
            elif kind == KIND_Q4_1:
                scale = f16_to_f32(d[g, b * ROWS + r])
                low = f16_to_f32(m[g, b * ROWS + r])
            else:
                scale = f16_to_f32(d[g, (b >> 3) * ROWS + r]) * np.float32(sc[g, b * ROWS + r])
                low = -f16_to_f32(m[g, (b >> 3) * ROWS + r]) * np.float32(mn[g, b * ROWS + r])
            for j in range(16):
                v = qs[g, (b * 16 + j) * ROWS + r]
                out[i, b * QK + j] = scale * np.float32(v & 15) + low
                out[i, b * QK + j + 16] = scale * np.float32(v >> 4) + low


@njit(**_KERNEL)
def _rows_q4k_records(ids, rec, rec16, mn, out) -> None:  # type: ignore[no-untyped-def]
    """_rows_q4's Q4_K rows read from the records (engine/cpu/records.py)."""
    for i in range(ids.shape[0]):
        g, r = ids[i] // ROWS, ids[i] % ROWS
        for b in range(out.shape[1] // QK):
            at = (b >> 3) * Q4K_RECORD
            sc_at, first = q4k_block_at(at, b & 7)
            dm = (at + Q4K_D) // 2
            scale = f16_to_f32(rec16[g, dm + r]) * np.float32(rec[g, sc_at + r])
            low = -f16_to_f32(rec16[g, dm + ROWS + r]) * np.float32(mn[g, b * ROWS + r])
            for j in range(16):
                v = rec[g, q4k_nibble_at(first, j, r)]
                out[i, b * QK + j] = scale * np.float32(v & 15) + low
                out[i, b * QK + j + 16] = scale * np.float32(v >> 4) + low


@njit(**_KERNEL)
def _rows_q5_1(ids, qs, qh, d, m, out) -> None:  # type: ignore[no-untyped-def]
    for i in range(ids.shape[0]):
        g, r = ids[i] // ROWS, ids[i] % ROWS
        for b in range(out.shape[1] // QK):
            dv, mv = f16_to_f32(d[g, b * ROWS + r]), f16_to_f32(m[g, b * ROWS + r])
            for j in range(16):
                v = qs[g, (b * 16 + j) * ROWS + r]
                h = qh[g, (b * 4 + (j >> 2)) * ROWS + r] >> (2 * (j & 3))
                out[i, b * QK + j] = dv * np.float32((v & 15) | ((h & 1) << 4)) + mv
                out[i, b * QK + j + 16] = dv * np.float32((v >> 4) | ((h & 2) << 3)) + mv


@njit(**_KERNEL)
def _rows_q5(ids, qs, qh, d, out) -> None:  # type: ignore[no-untyped-def]
    for i in range(ids.shape[0]):
        g, r = ids[i] // ROWS, ids[i] % ROWS
        for b in range(out.shape[1] // QK):
            dv = f16_to_f32(d[g, b * ROWS + r])
            for j in range(16):
                v = qs[g, (b * 16 + j) * ROWS + r]
                h = qh[g, (b * 4 + (j >> 2)) * ROWS + r] >> (2 * (j & 3))
                out[i, b * QK + j] = dv * np.float32(np.int32((v & 15) | ((h & 1) << 4)) - 16)
                out[i, b * QK + j + 16] = dv * np.float32(np.int32((v >> 4) | ((h & 2) << 3)) - 16)


@njit(**_KERNEL)
def _rows_q5k(ids, qs, qh, d, m, sc, mn, out) -> None:  # type: ignore[no-untyped-def]
    for i in range(ids.shape[0]):
        g, r = ids[i] // ROWS, ids[i] % ROWS
        for b in range(out.shape[1] // QK):
            scale = f16_to_f32(d[g, (b >> 3) * ROWS + r]) * np.float32(sc[g, b * ROWS + r])
            low = -f16_to_f32(m[g, (b >> 3) * ROWS + r]) * np.float32(mn[g, b * ROWS + r])
            for j in range(16):
                v = qs[g, (b * 16 + j) * ROWS + r]
                h = qh[g, (b * 4 + (j >> 2)) * ROWS + r] >> (2 * (j & 3))
                out[i, b * QK + j] = scale * np.float32((v & 15) | ((h & 1) << 4)) + low
                out[i, b * QK + j + 16] = scale * np.float32((v >> 4) | ((h & 2) << 3)) + low


@njit(**_KERNEL)
def _rows_iq4(ids, qs, d, sc, per_sub_block, out) -> None:  # type: ignore[no-untyped-def]
    for i in range(ids.shape[0]):
        g, r = ids[i] // ROWS, ids[i] % ROWS
        for b in range(out.shape[1] // QK):
            if per_sub_block:
                scale = f16_to_f32(d[g, (b >> 3) * ROWS + r]) * np.float32(sc[g, b * ROWS + r])
            else:
                scale = f16_to_f32(d[g, b * ROWS + r])
            for j in range(16):
                v = qs[g, (b * 16 + j) * ROWS + r]
                out[i, b * QK + j] = scale * np.float32(IQ4_LEVELS[v & 15])
                out[i, b * QK + j + 16] = scale * np.float32(IQ4_LEVELS[v >> 4])


@njit(**_KERNEL)
def _rows_k16(ids, qs, qh, d, m, sc, mn, is_q2, out) -> None:  # type: ignore[no-untyped-def]
    """Q3_K (stored q + 4) and Q2_K (w = d * sc * q - dmin * mn) rows."""
    for i in range(ids.shape[0]):
        g, r = ids[i] // ROWS, ids[i] % ROWS
        for b in range(out.shape[1] // QK):
            ds = f16_to_f32(d[g, (b >> 3) * ROWS + r])
            for p in range(8):
                v = np.int32(qs[g, (b * 8 + p) * ROWS + r])
                for k in range(4):
                    u = (v >> (2 * k)) & 3
                    half = (
                        k >> 1
                    )  # weights p, p + 8 in the first 16-weight sub-block, p + 16, p + 24 in the second
                    scale = ds * np.float32(sc[g, (2 * b + half) * ROWS + r])
                    if is_q2:
                        low = f16_to_f32(m[g, (b >> 3) * ROWS + r]) * np.float32(
                            mn[g, (2 * b + half) * ROWS + r]
                        )
                        out[i, b * QK + p + 8 * k] = scale * np.float32(u) - low
                    else:
                        h = (np.int32(qh[g, (b * 4 + (p & 3)) * ROWS + r]) >> (4 * (p >> 2) + k)) & 1
                        out[i, b * QK + p + 8 * k] = scale * np.float32((u | (h << 2)) - 4)


@njit(**_KERNEL)
def _rows_q6k(ids, qs, qh, sc, d, row_quads, out) -> None:  # type: ignore[no-untyped-def]
    """Q6_K rows from the field arrays or (`row_quads`) from engine/cpu/records.py's layout."""
    for i in range(ids.shape[0]):
        g, r = ids[i] // ROWS, ids[i] % ROWS
        for b in range(out.shape[1] // QK):
            ds = f16_to_f32(d[g, (b >> 3) * ROWS + r])
            dlo = ds * np.float32(sc[g, (2 * b) * ROWS + r])
            dhi = ds * np.float32(sc[g, (2 * b + 1) * ROWS + r])
            for j in range(16):
                if row_quads:
                    v = qs[g, q4k_nibble_at(b * 16 * ROWS, j, r)]
                    lo_at, lo_shift = q6k_top_at(b, j, r)
                    hi_at, hi_shift = q6k_top_at(b, j + 16, r)
                    lo_top, hi_top = (qh[g, lo_at] >> lo_shift) & 3, (qh[g, hi_at] >> hi_shift) & 3
                else:
                    v = qs[g, (b * 16 + j) * ROWS + r]
                    h = qh[g, (b * 8 + (j >> 1)) * ROWS + r] >> (4 * (j & 1))
                    lo_top, hi_top = h & 3, (h >> 2) & 3
                out[i, b * QK + j] = dlo * np.float32(np.int32((v & 15) | (lo_top << 4)) - 32)
                out[i, b * QK + j + 16] = dhi * np.float32(np.int32((v >> 4) | (hi_top << 4)) - 32)


@njit(**_KERNEL)
def _rows_q8(ids, qs, d, out) -> None:  # type: ignore[no-untyped-def]
    for i in range(ids.shape[0]):
        g, r = ids[i] // ROWS, ids[i] % ROWS
        for b in range(out.shape[1] // QK):
            dv = f16_to_f32(d[g, b * ROWS + r])
            for k in range(QK):
                out[i, b * QK + k] = dv * np.float32(qs[g, (b * QK + k) * ROWS + r])


@njit(**_KERNEL)
def _rows_float(ids, f, out) -> None:  # type: ignore[no-untyped-def]
    for i in range(ids.shape[0]):
        g, r = ids[i] // ROWS, ids[i] % ROWS
        for k in range(out.shape[1]):
            out[i, k] = to_f32(f[g, k * ROWS + r])


# ---------------------------------------------------------------------------------------------------
# Python entry points: a dictionary lookup and one call into compiled code.


def _check(x: np.ndarray, w: PackedWeight, out: np.ndarray) -> None:
    if x.dtype != np.float32 or out.dtype != np.float32:
        raise TypeError("matmul works on float32 arrays")
    if not (x.flags.c_contiguous and out.flags.c_contiguous):
        raise ValueError("matmul needs C-contiguous x and out")
    if x.ndim != 2 or x.shape[1] != w.n_cols or out.shape != (x.shape[0], w.n_rows):
        raise ValueError(f"matmul shapes: x {x.shape}, weight ({w.n_rows}, {w.n_cols}), out {out.shape}")


def matmul(x: np.ndarray, w: PackedWeight, out: np.ndarray) -> None:
    """out[T, N] = x[T, K] @ W.T in float32; x and out C-contiguous."""
    _check(x, w, out)
    _MATMUL[w.qtype](x, w, out)


def get_rows(w: PackedWeight, ids: np.ndarray, out: np.ndarray) -> None:
    """Embedding lookup: out[i] = dequantized row ids[i] of W (ids int32, out float32 (len(ids), K))."""
    if out.dtype != np.float32 or not out.flags.c_contiguous or out.shape != (len(ids), w.n_cols):
        raise ValueError(f"get_rows: out must be float32 C-contiguous ({len(ids)}, {w.n_cols})")
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    if ids.size and (ids.min() < 0 or ids.max() >= w.n_rows):
        raise IndexError(f"get_rows: ids out of range [0, {w.n_rows})")
    _GET_ROWS[w.qtype](w, ids, out)


# Tiles of 4 or more tokens take the VNNI kernels where the CPU has them (the int16 path keeps T < 4
# compiling everywhere); the 4-bit types take them at every T (vpdpbusd tiles for 1 and 2 tokens).
VNNI_MIN_TOKENS = 4


# Row groups in chunks from a counter (engine/cpu/chunks.py) only for weights of 4 MiB and more: the
# counter's atomics cost a small matrix more than its static split loses. Gemma 3 270M (matrices of
# 0.7-1.5 MiB) decoded 1.024x slower with every Q4_K/Q6_K matmul chunked (60 rounds, faster in 12),
# SmolLM2 1.091x with its Q4_1/Q8_0 ones; Qwen2.5-Coder 1.5B's 8-191 MiB matrices gain (chunks.py).
CHUNKED_MIN_BYTES = 4 << 20


def _chunked(w: PackedWeight) -> bool:
    return w.nbytes >= CHUNKED_MIN_BYTES


def _byte_dot_layout(w: PackedWeight) -> None:
    """Records and row quads are read by the byte dot-product kernels only, which portable lacks."""
    if not BYTE_DOT:
        raise ValueError(
            f"a repacked {w.qtype.name} weight needs the byte dot-product kernels (not portable)"
        )


def _matmul_q4k_dispatch(x: np.ndarray, w: PackedWeight, out: np.ndarray) -> None:
    if not w.repacked:  # portable (pack_weight_for_cpu), or engine.quant's field arrays as they are
        _matmul_q4_k(x, w.qs, w.d, w.m, w.sc, w.mn, out)
        return
    _byte_dot_layout(w)
    if _chunked(w):
        _matmul_q4k_records_chunked(x, w.qs, w.qs.view(np.uint16), w.mn, out, get_num_threads())
    else:
        _matmul_q4k_records(x, w.qs, w.qs.view(np.uint16), w.mn, out)


def _matmul_q6k_dispatch(x: np.ndarray, w: PackedWeight, out: np.ndarray) -> None:
    args = (x, w.qs, w.qh, w.sc, w.d, out)
    if w.repacked:
        _byte_dot_layout(w)
    if w.repacked and _chunked(w):
        _matmul_q6k_row_quads_chunked(*args, get_num_threads())
    elif w.repacked:
        _matmul_q6k_row_quads(*args)
    else:  # portable (pack_weight_for_cpu), or engine.quant's field arrays as they are
        _matmul_q6k(*args)


def _vnni(x: np.ndarray) -> bool:
    return BYTE_DOT and x.shape[0] >= VNNI_MIN_TOKENS


_MATMUL = {
    QType.Q4_0: lambda x, w, out: (_matmul_q4_0_vnni if BYTE_DOT else _matmul_q4_0)(x, w.qs, w.d, out),
    QType.Q4_1: lambda x, w, out: (_matmul_q4_1_vnni if BYTE_DOT else _matmul_q4_1)(x, w.qs, w.d, w.m, out),
    QType.Q4_K: _matmul_q4k_dispatch,
    QType.Q5_0: lambda x, w, out: (_matmul_q5_vnni if BYTE_DOT else _matmul_q5)(x, w.qs, w.qh, w.d, out),
    QType.Q3_K: lambda x, w, out: _matmul_q3k(x, w.qs, w.qh, w.d, w.sc, out),
    QType.Q2_K: lambda x, w, out: _matmul_q2k(x, w.qs, w.d, w.m, w.sc, w.mn, out),
    QType.Q5_1: lambda x, w, out: (_matmul_q5_1_vnni if BYTE_DOT else _matmul_q5_1)(
        x, w.qs, w.qh, w.d, w.m, out
    ),
    QType.Q5_K: lambda x, w, out: (_matmul_q5k_vnni if BYTE_DOT else _matmul_q5k)(
        x, w.qs, w.qh, w.d, w.m, w.sc, w.mn, out
    ),
    QType.Q6_K: _matmul_q6k_dispatch,
    QType.IQ4_NL: lambda x, w, out: (_matmul_iq4_nl_vnni if BYTE_DOT else _matmul_iq4_nl)(x, w.qs, w.d, out),
    QType.IQ4_XS: lambda x, w, out: (_matmul_iq4_xs_vnni if BYTE_DOT else _matmul_iq4_xs)(
        x, w.qs, w.d, w.sc, out
    ),
    QType.Q8_0: lambda x, w, out: (_matmul_q8_vnni if BYTE_DOT else _matmul_q8)(x, w.qs, w.d, out),
    QType.F32: lambda x, w, out: _matmul_float(x, w.f, out),
    QType.F16: lambda x, w, out: _matmul_float(x, w.f, out),
    QType.BF16: lambda x, w, out: _matmul_float(_round_to_bf16(x), w.f, out),
}

_GET_ROWS = {
    QType.Q4_0: lambda w, ids, out: _rows_q4(ids, w.qs, w.d, w.m, w.sc, w.mn, KIND_Q4_0, out),
    QType.Q4_1: lambda w, ids, out: _rows_q4(ids, w.qs, w.d, w.m, w.sc, w.mn, KIND_Q4_1, out),
    QType.Q4_K: lambda w, ids, out: (
        _rows_q4k_records(ids, w.qs, w.qs.view(np.uint16), w.mn, out)
        if w.repacked
        else _rows_q4(ids, w.qs, w.d, w.m, w.sc, w.mn, KIND_Q4_K, out)
    ),
    QType.Q5_0: lambda w, ids, out: _rows_q5(ids, w.qs, w.qh, w.d, out),
    QType.Q3_K: lambda w, ids, out: _rows_k16(ids, w.qs, w.qh, w.d, w.d, w.sc, w.sc, False, out),
    QType.Q2_K: lambda w, ids, out: _rows_k16(ids, w.qs, w.qs, w.d, w.m, w.sc, w.mn, True, out),
    QType.Q5_1: lambda w, ids, out: _rows_q5_1(ids, w.qs, w.qh, w.d, w.m, out),
    QType.Q5_K: lambda w, ids, out: _rows_q5k(ids, w.qs, w.qh, w.d, w.m, w.sc, w.mn, out),
    QType.Q6_K: lambda w, ids, out: _rows_q6k(ids, w.qs, w.qh, w.sc, w.d, w.repacked, out),
    QType.IQ4_NL: lambda w, ids, out: _rows_iq4(ids, w.qs, w.d, w.sc, False, out),
    QType.IQ4_XS: lambda w, ids, out: _rows_iq4(ids, w.qs, w.d, w.sc, True, out),
    QType.Q8_0: lambda w, ids, out: _rows_q8(ids, w.qs, w.d, out),
    QType.F32: lambda w, ids, out: _rows_float(ids, w.f, out),
    QType.F16: lambda w, ids, out: _rows_float(ids, w.f, out),
    QType.BF16: lambda w, ids, out: _rows_float(ids, w.f, out),
}
