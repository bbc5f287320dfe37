"""exp for float32 that LLVM vectorises: math.exp in a Numba loop is a scalar libm call per element.

Cody-Waite reduction x = n ln2 + r with |r| <= ln2 / 2, a degree-6 Taylor polynomial for e^r, and 2^n
put straight into the float's exponent bits. Relative error stays within a few float32 ulp over the
range that matters (the softmax's x <= 0 and the activations); below -87 the result is 0, as e^x
underflows there anyway.

Numba's cache checks the timestamp of a kernel's own file only: after editing this module, clear the
JIT cache (`rm -rf ~/.cache/llamba/numba`) or the kernels that inline it keep the old code.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

_LOG2E = np.float32(1.4426950408889634)
_LN2_HI = np.float32(0.693145751953125)  # ln 2 split so that n * _LN2_HI is exact
_LN2_LO = np.float32(1.428606765330187e-06)
_MIN_X = np.float32(-87.0)
_MAX_X = np.float32(88.0)


@intrinsic
def bits_to_f32(typingctx, bits):  # type: ignore[no-untyped-def]
    """The float32 whose bit pattern is the low 32 bits of the integer `bits`."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        low = builder.trunc(args[0], ir.IntType(32)) if bits.bitwidth > 32 else args[0]
        return builder.bitcast(low, ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def f32_to_bits(typingctx, value):  # type: ignore[no-untyped-def]
    """The bit pattern of the float32 `value` as an int32."""
    if value != types.float32:
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.IntType(32))

    return types.int32(value), codegen


@njit(inline="always", cache=True, nogil=True, fastmath=True)
def exp(x: np.float32) -> np.float32:
    """e^x in float32, vectorisable."""
    x = min(max(np.float32(x), _MIN_X), _MAX_X)
    n = np.rint(x * _LOG2E)
    r = (x - n * _LN2_HI) - n * _LN2_LO
    p = np.float32(1.0 / 720.0)
    p = p * r + np.float32(1.0 / 120.0)
    p = p * r + np.float32(1.0 / 24.0)
    p = p * r + np.float32(1.0 / 6.0)
    p = p * r + np.float32(0.5)
    p = p * r + np.float32(1.0)
    p = p * r + np.float32(1.0)
    scale = bits_to_f32((np.int32(n) + np.int32(127)) << np.int32(23))
    return p * scale if x > _MIN_X else np.float32(0.0)
