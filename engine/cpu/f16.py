"""IEEE half precision inside Numba CPU kernels, which have no float16 type: values travel as uint16 bits.

The KV cache is stored this way (llama.cpp's default cache type is f16 too): half the bytes that decode
at long context has to read. The conversions are LLVM's own `fpext`/`fptrunc` on the `half` type, which
x86 CPUs with F16C run as vcvtph2ps/vcvtps2ph, vectorised; rounding is to nearest even, as numpy's.
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
def half_to_float(h: np.uint16) -> np.float32:
    """The float32 value of half-precision bits h."""
    return _half_bits_to_float(h)


@njit(inline="always", cache=True, nogil=True)
def float_to_half(x: np.float32) -> np.uint16:
    """Half-precision bits of x, rounded to nearest even (overflow gives inf, as numpy's astype)."""
    return _float_to_half_bits(np.float32(x))
