"""IEEE half precision inside Numba CPU kernels, which have no float16 type: values travel as uint16 bits.

The KV cache is stored this way (llama.cpp's default cache type is f16 too): half the bytes that decode
at long context has to read. The conversions are LLVM's own `fpext`/`fptrunc` on the `half` type, which
x86 CPUs with F16C run as vcvtph2ps/vcvtps2ph, vectorised; rounding is to nearest even, as numpy's.
A target without F16C (the portable level, engine/cpu/isa.py) gets the same conversions in integer
arithmetic: LLVM would call compiler-rt's __truncsfhf2 there, which Numba's JIT cannot link (the
process aborts with "Symbol not found").
(engine.cpu.matmul converts its f16 scales with integer shifts instead: measured faster there, 1.5x
slower in the attention loops.)

Numba's cache checks the timestamp of a kernel's own file only: after editing this module, clear the
JIT cache (`rm -rf ~/.cache/llamba/numba`) or the kernels that inline it keep the old code.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from engine.cpu import isa
from engine.cpu.vecmath import bits_to_f32, f32_to_bits

F16C = "f16c" in isa.current().features


@intrinsic
def _half_bits_to_float(typingctx, bits):  # type: ignore[no-untyped-def]
    if bits != types.uint16:
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def _float_to_half_bits(typingctx, x):  # type: ignore[no-untyped-def]
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(x), codegen


@njit(inline="always", cache=True, nogil=True)
def _half_to_float_integer(h: np.uint16) -> np.float32:
    bits = np.int64(h)
    sign = (bits & 0x8000) << 16
    exponent, mantissa = (bits >> 10) & 0x1F, bits & 0x3FF
    if exponent == 0:  # zero or subnormal: mantissa x 2^-24, exact in float32
        magnitude = np.float32(mantissa) * np.float32(5.9604644775390625e-08)
        return -magnitude if sign else magnitude
    if exponent == 0x1F:  # inf, nan
        return bits_to_f32(sign | 0x7F800000 | (mantissa << 13))
    return bits_to_f32(sign | ((exponent + 112) << 23) | (mantissa << 13))


@njit(inline="always", cache=True, nogil=True)
def _round_shift(value: np.int64, shift: np.int64) -> np.int64:
    """value >> shift rounded to nearest, ties to even."""
    kept, rest, half = value >> shift, value & ((1 << shift) - 1), 1 << (shift - 1)
    return kept + 1 if rest > half or (rest == half and kept & 1) else kept


@njit(inline="always", cache=True, nogil=True)
def _float_to_half_integer(x: np.float32) -> np.uint16:
    bits = np.int64(f32_to_bits(x)) & 0xFFFFFFFF
    sign = (bits >> 16) & 0x8000
    biased, mantissa = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    if biased == 0xFF:  # inf, nan (kept quiet)
        return np.uint16(sign | 0x7C00 | (0x200 if mantissa else 0))
    exponent = biased - 127
    if exponent > 15:
        return np.uint16(sign | 0x7C00)
    if exponent >= -14:  # normal; a carry out of the mantissa moves the exponent (up to inf)
        return np.uint16(sign | min(_round_shift(((exponent + 15) << 23) | mantissa, 13), 0x7C00))
    if exponent < -25:
        return np.uint16(sign)
    return np.uint16(
        sign | _round_shift(mantissa | 0x800000, -exponent - 1)
    )  # subnormal (or the least normal)


@njit(inline="always", cache=True, nogil=True)
def half_to_float(h: np.uint16) -> np.float32:
    """The float32 value of half-precision bits h."""
    if F16C:
        return _half_bits_to_float(h)
    return _half_to_float_integer(h)


@njit(inline="always", cache=True, nogil=True)
def float_to_half(x: np.float32) -> np.uint16:
    """Half-precision bits of x, rounded to nearest even (overflow gives inf, as numpy's astype)."""
    if F16C:
        return _float_to_half_bits(np.float32(x))
    return _float_to_half_integer(np.float32(x))
