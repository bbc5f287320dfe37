"""Float sums that come out the same bits on every x86 level: fixed lanes, one order.

Under fastmath's "reassoc" LLVM vectorizes a sum at the target's own width (16 float lanes, times its
interleave, on AVX-512; 8 on AVX2) and so adds the same numbers in another order on each level. The
attention kernels did: Gemma 3's per-token hidden states differed between avx512-vnni and avx2, and the
int8 roundings of the next matmuls amplified that to a per-token cosine with llama.cpp of 0.9901 on one
level and 0.9891 on the other (issue 48). Kernels that sum floats compile with ORDERED (no "reassoc")
and add into LANES lanes held on the stack: each level runs the lanes as its own vectors (one zmm, two
ymm), but every lane adds the same numbers in the same order, and `lane_total` folds the lanes in one
fixed tree. tests/level_outputs.py prints digests of these kernels per level; tests/test_cpu_levels.py
compares them across levels.

Cost, avx512-vnni, `ops.attention` of 512 prefill tokens over 512 cells, 2 threads, best of 5 (another
job was running on the machine): Gemma 3's shape (4 heads, 1 kv head, head_dim 256) 7.36 -> 7.75 ms,
SmolLM2's (9 / 3, 64) 6.20 -> 6.37 ms; one decode token over 2048 cells 0.12 / 0.10 ms either way.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.extending import intrinsic

from engine.cpu.matmul.tiles import _alloca_f32
from engine.cpu.vecmath import exp

# fastmath less "reassoc": FMA contraction and the rest stay, the order of every sum is the code's.
ORDERED = {"nnan", "ninf", "nsz", "arcp", "contract", "afn"}
LANES = 16


@njit(inline="always", fastmath=ORDERED)
def zero_lanes() -> np.ndarray:
    """Four rows of LANES float32 lanes on the stack, all 0: up to four sums side by side."""
    acc = carray(_alloca_f32(64), (4, LANES))
    for k in range(4):
        for lane in range(LANES):
            acc[k, lane] = np.float32(0.0)
    return acc


def _indices(lanes: range) -> ir.Constant:
    return ir.Constant(ir.VectorType(ir.IntType(32), len(lanes)), list(lanes))


@intrinsic
def _fold16(typingctx, row):  # type: ignore[no-untyped-def]
    """The sum of a contiguous 16-float array as one tree of vector adds: halves, then quarters..."""
    if not (isinstance(row, types.Array) and row.dtype == types.float32 and row.ndim == 1):
        return None

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        vec = ir.VectorType(ir.FloatType(), LANES)
        v = builder.load(builder.bitcast(data, vec.as_pointer()), align=4)
        width = LANES
        while width > 1:
            width //= 2
            lo = builder.shuffle_vector(v, v, _indices(range(width)))
            hi = builder.shuffle_vector(v, v, _indices(range(width, 2 * width)))
            v = builder.fadd(lo, hi)
        return builder.extract_element(v, ir.Constant(ir.IntType(32), 0))

    return types.float32(row), codegen


@njit(inline="always")
def lane_total(acc: np.ndarray) -> np.float32:
    """The sum of LANES lanes (a row of `zero_lanes`), folded in halves (8 + 8, 4 + 4, 2 + 2, 1 + 1):
    one tree of vector adds, the same on every level (scalar adds, as LLVM left a loop of them, cost
    dot4 20% at head_dim 64)."""
    return _fold16(acc)


@njit(inline="always", fastmath=ORDERED, error_model="numpy")
def scale_and_max(s: np.ndarray, sc: np.float32, n: int) -> np.float32:
    """s[j] *= sc for j < n, and their max, in LANES lanes too (without "reassoc" a one-at-a-time chain of
    compares would not vectorize; a max is exact in any order)."""
    acc = zero_lanes()
    for lane in range(LANES):
        acc[0, lane] = np.float32(-np.inf)
    body = n - n % LANES
    for j0 in range(0, body, LANES):
        for lane in range(LANES):
            s[j0 + lane] *= sc
            acc[0, lane] = max(acc[0, lane], s[j0 + lane])
    for j in range(body, n):
        s[j] *= sc
        acc[0, 0] = max(acc[0, 0], s[j])
    best = acc[0, 0]
    for lane in range(1, LANES):
        best = max(best, acc[0, lane])
    return best


@njit(inline="always", fastmath=ORDERED, error_model="numpy")
def exp_and_sum(s: np.ndarray, best: np.float32, n: int) -> np.float32:
    """s[j] = exp(s[j] - best) for j < n, and their sum (in LANES lanes)."""
    acc = zero_lanes()
    body = n - n % LANES
    for j0 in range(0, body, LANES):
        for lane in range(LANES):
            s[j0 + lane] = exp(s[j0 + lane] - best)
            acc[0, lane] += s[j0 + lane]
    for j in range(body, n):
        s[j] = exp(s[j] - best)
        acc[0, j - body] += s[j]
    return lane_total(acc[0])
