"""Activation quantization for the CPU matmul kernels (llama.cpp's q8_0, q8_1 and q8_K blocks), and the
activation sums and byte quads the integer tiles read."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from engine.cpu.f16 import float_to_half
from engine.cpu.matmul.tiles import _EXACT, _KERNEL, f16_to_f32
from engine.quant import QK, QType

F0 = np.float32(0.0)
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
    QType.MXFP4: ACT_Q8_0,
    QType.IQ4_XS: ACT_Q8_K,
    QType.Q2_K: ACT_Q8_K,
    QType.Q3_K: ACT_Q8_K,
    QType.Q4_K: ACT_Q8_K,
    QType.Q5_K: ACT_Q8_K,
    QType.Q6_K: ACT_Q8_K,
}


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
        _quantize_rows(x, np.int64(t), kind, xq, xd, xs)  # one callee type (engine/cpu/attention.py)


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
