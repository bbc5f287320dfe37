"""The integer dot products of the byte kernels, as LLVM IR for the level in use (engine/cpu/isa.py).

The kernels' intrinsics (engine/cpu/matmul/intrinsics.py) work on 512-bit values: 64 weight bytes of
16 rows x 4 positions as <16 x i32>, times 4 broadcast int8 activations per int32 lane. Each operation
here emits the level's own instructions for one such value:

| operation | avx512-vnni | avx-vnni (2 ymm) | avx2 (2 ymm) |
| --- | --- | --- | --- |
| `dot_unsigned` (u8 weights < 128) | vpdpbusd | {vex} vpdpbusd | vpmaddubsw, vpmaddwd by 1, vpaddd |
| `dot_signed` (s8 weights) | - (callers offset by 128) | - (the same) | vpsignb, vpabsb, as above |
| `dot_pairs` (int16 pairs) | vpdpwssd | {vex} vpdpwssd | vpmaddwd, vpaddd |
| `byte_lookup` (16-entry table) | vpshufb | vpshufb | vpshufb |

The sums are the same integers on every level, so the outputs are bitwise the same. Two limits of
AVX2's vpmaddubsw shape the callers: it adds two u8 x s8 products into a saturating int16 (weights
below 128 never reach it: 2 x 127 x 127 < 32767), and it has no accumulator (three instructions where
VNNI has one). So on AVX2 the signed weights (Q8_0's, IQ4's levels) take vpsignb's sign trick instead of
VNNI's weight + 128 offset, and `chains` (independent accumulators against vpdpbusd's latency) is 1:
the running sum is a one-cycle vpaddd, and two 256-bit halves already double the registers a 512-bit
accumulator takes (16 ymm in all).
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from engine.cpu import isa

TARGET = isa.current()
VNNI = TARGET.level.name in ("avx512-vnni", "avx-vnni")
WIDE = TARGET.level.name == "avx512-vnni"  # 512-bit instructions
# VNNI's unsigned x signed product takes signed weights offset by 128 (the callers subtract 128 x sum(x)).
SIGNED_BY_OFFSET = VNNI

_I32 = ir.IntType(32)
V16I32 = ir.VectorType(_I32, 16)
V64I8 = ir.VectorType(ir.IntType(8), 64)
_V8I32 = ir.VectorType(_I32, 8)
_V32I8 = ir.VectorType(ir.IntType(8), 32)
_V16I16 = ir.VectorType(ir.IntType(16), 16)


def _require_byte_dot() -> None:
    """A portable target has none of these instructions: a Python error while compiling (LLVM itself
    would abort the process on the intrinsic)."""
    if not TARGET.level.byte_dot:
        raise NotImplementedError(
            f"the {TARGET.level.name} level ({TARGET.cpu}) has no byte dot-product kernels"
        )


def chains(wanted: int) -> int:
    """Accumulators per sum: `wanted` where one 512-bit instruction accumulates, fewer on halves."""
    if WIDE:
        return wanted
    return max(1, wanted // 2) if VNNI else 1


def _splat_zero():  # type: ignore[no-untyped-def]
    return ir.Constant(V16I32, [0] * 16)


def _function(builder, name: str, result, args):  # type: ignore[no-untyped-def]
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(result, args), name)


def _halves(builder, value, half_type):  # type: ignore[no-untyped-def]
    """The low and high 256 bits of a 512-bit value, as half_type."""
    n = value.type.count // 2
    return [
        builder.bitcast(
            builder.shuffle_vector(
                value, value, ir.Constant(ir.VectorType(_I32, n), list(range(h * n, h * n + n)))
            ),
            half_type,
        )
        for h in (0, 1)
    ]


def _joined(builder, low, high):  # type: ignore[no-untyped-def]
    return builder.shuffle_vector(low, high, ir.Constant(V16I32, list(range(16))))


def _on_halves(builder, op, acc, *values):  # type: ignore[no-untyped-def]
    """op(acc half, value halves...) on each 256-bit half, joined back into 512 bits."""
    parts = zip(_halves(builder, acc, _V8I32), *(_halves(builder, v, _V8I32) for v in values), strict=True)
    return _joined(builder, *(op(*part) for part in parts))


def _pmaddubsw(builder, weights, x):  # type: ignore[no-untyped-def]
    """The 16 int16 sums of pairs of u8 weights times s8 x, on 256 bits (AVX2), as <8 x i32>."""
    pairs = _function(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [_V32I8, _V32I8])
    return builder.bitcast(
        builder.call(pairs, [builder.bitcast(weights, _V32I8), builder.bitcast(x, _V32I8)]), _V8I32
    )


def _pmaddwd_add(builder, acc, words, other):  # type: ignore[no-untyped-def]
    """acc + the int16 products words x other added pairwise into int32 lanes, on 256 bits (AVX2)."""
    madd = _function(builder, "llvm.x86.avx2.pmadd.wd", _V8I32, [_V16I16, _V16I16])
    return builder.add(
        acc, builder.call(madd, [builder.bitcast(words, _V16I16), builder.bitcast(other, _V16I16)])
    )


_ONES16 = ir.Constant(_V16I16, [1] * 16)


def _pmaddubsw_sum(builder, acc, weights, x):  # type: ignore[no-untyped-def]
    """acc + the 4 products a lane of u8 weights and s8 x, on 256 bits (AVX2)."""
    return _pmaddwd_add(builder, acc, _pmaddubsw(builder, weights, x), _ONES16)


def _vnni(builder, name: str, acc, weights, x):  # type: ignore[no-untyped-def]
    """VNNI's instruction `name` (vpdpbusd, vpdpwssd) on 512 bits, or on each 256-bit half (AVX-VNNI)."""
    if WIDE:
        return builder.call(
            _function(builder, f"llvm.x86.avx512.{name}.512", V16I32, [V16I32] * 3), [acc, weights, x]
        )
    half = _function(builder, f"llvm.x86.avx512.{name}.256", _V8I32, [_V8I32] * 3)
    return _on_halves(builder, lambda a, w, v: builder.call(half, [a, w, v]), acc, weights, x)


def dot_unsigned(builder, acc, weights, x):  # type: ignore[no-untyped-def]
    """acc (16 int32) + per lane the sum of 4 products of weight bytes (unsigned; below 128 unless
    VNNI) and activation bytes (signed)."""
    _require_byte_dot()
    if VNNI:
        return _vnni(builder, "vpdpbusd", acc, weights, x)
    return _on_halves(builder, lambda a, w, v: _pmaddubsw_sum(builder, a, w, v), acc, weights, x)


# AVX2's products leave vpmaddubsw as int16 pair sums; where a caller's weights are small, several of
# them add up in int16 (vpaddsw, see word_dot) before one vpmaddwd widens them: two instructions per dot
# product where `dot_unsigned` takes three. `word_budget` says how many fit for weights up to a maximum:
# the pair sums of 4-bit weights are at most 2 x 15 x 127 = 3810, so 8 fit (Q4_K's whole block); 5-bit
# 4, 6-bit 2.
WORD_SUMS = not VNNI and TARGET.level.byte_dot


def word_budget(max_weight: int) -> int:
    """Dot products whose int16 pair sums may add up before widening (1: widen every one)."""
    return max(1, 32767 // (2 * max_weight * 127)) if WORD_SUMS else 1


def word_dot(builder, words, weights, x):  # type: ignore[no-untyped-def]
    """words (32 int16 pair sums, as <16 x i32>; None: zero) + vpmaddubsw(weights, x)."""
    _require_byte_dot()
    # vpaddsw, not vpaddw: the sums never saturate (word_budget), and LLVM's reassociation leaves an
    # intrinsic where it is. A plain add's chain was regrouped at its end, which kept every product of a
    # 4-token AVX2 block live: 85 stack accesses a block against 16 (llvm-mca, znver3).
    add = _function(builder, "llvm.sadd.sat.v16i16", _V16I16, [_V16I16, _V16I16])

    def op(w16, w, v):  # type: ignore[no-untyped-def]
        product = builder.bitcast(_pmaddubsw(builder, w, v), _V16I16)
        if words is not None:
            product = builder.call(add, [builder.bitcast(w16, _V16I16), product])
        return builder.bitcast(product, _V8I32)

    return _on_halves(builder, op, _splat_zero() if words is None else words, weights, x)


def widen_words(builder, acc, words, by=None):  # type: ignore[no-untyped-def]
    """acc + the int16 pair sums in words added pairwise into int32 lanes (vpmaddwd by 1), each pair
    times `by`'s int16 factors where given (<16 x i32>: a lane's two factors)."""
    if by is None:
        return _on_halves(builder, lambda a, w: _pmaddwd_add(builder, a, w, _ONES16), acc, words)
    return _on_halves(builder, lambda a, w, f: _pmaddwd_add(builder, a, w, f), acc, words, by)


def dot_signed(builder, acc, weights, x):  # type: ignore[no-untyped-def]
    """dot_unsigned with signed weight bytes, on AVX2: |w| times x with w's sign (vpsignb)."""
    _require_byte_dot()
    assert not SIGNED_BY_OFFSET, "VNNI levels offset signed weights by 128 (SIGNED_BY_OFFSET)"
    sign = _function(builder, "llvm.x86.avx2.psign.b", _V32I8, [_V32I8, _V32I8])
    absolute = _function(builder, "llvm.abs.v32i8", _V32I8, [_V32I8, ir.IntType(1)])

    def op(a, w, v):  # type: ignore[no-untyped-def]
        w8, v8 = builder.bitcast(w, _V32I8), builder.bitcast(v, _V32I8)
        magnitude = builder.call(absolute, [w8, ir.Constant(ir.IntType(1), 0)])
        return _pmaddubsw_sum(builder, a, magnitude, builder.call(sign, [v8, w8]))

    return _on_halves(builder, op, acc, weights, x)


def dot_pairs(builder, acc, weights, x):  # type: ignore[no-untyped-def]
    """acc + per lane w_low * x_low + w_high * x_high, each int32 lane two int16 (vpdpwssd)."""
    _require_byte_dot()
    if VNNI:
        return _vnni(builder, "vpdpwssd", acc, weights, x)
    return _on_halves(builder, lambda a, w, v: _pmaddwd_add(builder, a, w, v), acc, weights, x)


def byte_lookup(builder, table, indices):  # type: ignore[no-untyped-def]
    """table[index] per byte (64 bytes; the table repeats every 16, indices below 16): vpshufb."""
    _require_byte_dot()
    if WIDE:
        return builder.call(
            _function(builder, "llvm.x86.avx512.pshuf.b.512", V64I8, [V64I8] * 2), [table, indices]
        )
    pshufb = _function(builder, "llvm.x86.avx2.pshuf.b", _V32I8, [_V32I8] * 2)
    low, high = (
        builder.call(pshufb, [t, i])
        for t, i in zip(_halves(builder, table, _V32I8), _halves(builder, indices, _V32I8), strict=True)
    )
    return builder.shuffle_vector(low, high, ir.Constant(ir.VectorType(_I32, 64), list(range(64))))
