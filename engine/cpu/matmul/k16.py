"""The Q2_K and Q3_K matmul kernels: a scale per 16 weights, int16 tiles."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from engine.cpu.matmul.activations import ACT_Q8_K, _quantize
from engine.cpu.matmul.tiles import (
    _KERNEL,
    _each_tile,
    _lanes,
    _store_tile,
    _zero_tile,
    f16_to_f32,
    stack_tile_f32,
    stack_tile_i16,
)
from engine.quant import QK, ROWS

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
    _store_tile(acc, out, np.int64(g), np.int64(t0), n_tok)


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
