"""Element-wise and attention kernels for the CPU: RMSNorm, RoPE, attention over the KV cache, activations.

All work in float32 on C-contiguous arrays and write into caller-owned outputs. Shapes use T for the
number of tokens in the batch (prefill chunks and decode tokens of several sequences, mixed).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from engine.cpu.f16 import float_to_half, half_to_float
from engine.cpu.vecmath import exp

# error_model "numpy": a float division may give inf instead of raising, so loops that divide vectorise.
_KERNEL = {"cache": True, "nogil": True, "fastmath": True, "error_model": "numpy"}
F0 = np.float32(0.0)
F1 = np.float32(1.0)


@njit(**_KERNEL)
def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray) -> None:
    """out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, for every row r of a 2-D x."""
    rows, dim = x.shape
    for r in range(rows):
        ss = F0
        for i in range(dim):
            ss += x[r, i] * x[r, i]
        scale = F1 / np.float32(math.sqrt(ss / np.float32(dim) + np.float32(eps)))
        for i in range(dim):
            out[r, i] = x[r, i] * scale * weight[i]


@njit(**_KERNEL)
def rope(x: np.ndarray, positions: np.ndarray, freq_base: float, neox: bool) -> None:
    """Rotary position embedding in place on x[T, n_heads, head_dim].

    Angles follow ggml: theta_0 = position, theta_{i+1} = theta_i * base^(-2/dim), in float32.
    `neox` rotates the pairs (i, i + dim/2); otherwise consecutive pairs (2i, 2i+1) ("normal" mode).
    """
    n_tok, n_heads, dim = x.shape
    half = dim // 2
    theta_scale = np.float32(freq_base) ** np.float32(-2.0 / dim)
    cos_t = np.empty(half, dtype=np.float32)
    sin_t = np.empty(half, dtype=np.float32)
    for t in range(n_tok):
        theta = np.float32(positions[t])
        for i in range(half):
            cos_t[i] = np.float32(math.cos(theta))
            sin_t[i] = np.float32(math.sin(theta))
            theta *= theta_scale
        for h in range(n_heads):
            for i in range(half):
                a = 2 * i if not neox else i
                b = a + 1 if not neox else i + half
                x0 = x[t, h, a]
                x1 = x[t, h, b]
                x[t, h, a] = x0 * cos_t[i] - x1 * sin_t[i]
                x[t, h, b] = x0 * sin_t[i] + x1 * cos_t[i]


@njit(**_KERNEL)
def _store_kv(
    k: np.ndarray,
    v: np.ndarray,
    seq_ids: np.ndarray,
    positions: np.ndarray,
    k_bits: np.ndarray,
    v_bits: np.ndarray,
) -> None:
    n_tok, n_kv, dim = k.shape
    for t in range(n_tok):
        for h in range(n_kv):
            for i in range(dim):
                k_bits[seq_ids[t], h, positions[t], i] = float_to_half(k[t, h, i])
                v_bits[seq_ids[t], h, positions[t], i] = float_to_half(v[t, h, i])


def store_kv(
    k: np.ndarray,
    v: np.ndarray,
    seq_ids: np.ndarray,
    positions: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
) -> None:
    """Write k/v[T, n_kv_heads, head_dim] into the float16 caches [n_seq, n_kv_heads, n_ctx, head_dim]."""
    _store_kv(k, v, seq_ids, positions, k_cache.view(np.uint16), v_cache.view(np.uint16))


# Keys per attention job. Long contexts are split into chunks so that one decoding sequence still
# keeps every thread busy; the size is fixed, never derived from the batch, so a token's result is
# the same whichever batch it is computed in (prefill, decode, alone or with other sequences).
KEY_CHUNK = 256


def attention(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    seq_ids: np.ndarray,
    positions: np.ndarray,
    window: int,
    scale: float,
    out: np.ndarray,
) -> None:
    """Causal attention of q[T, n_heads, head_dim] over the float16 cached keys/values of each token.

    Token t attends to cache cells 0..positions[t] of its sequence (the batch's own k/v are already
    stored). With window > 0 only the last `window` positions are visible (sliding-window layers).
    Grouped-query: query head h reads kv head h // (n_heads / n_kv_heads).
    """
    _attention(q, k_cache.view(np.uint16), v_cache.view(np.uint16), seq_ids, positions, window, scale, out)


@njit(parallel=True, **_KERNEL)
def _attention(
    q: np.ndarray,
    k_bits: np.ndarray,
    v_bits: np.ndarray,
    seq_ids: np.ndarray,
    positions: np.ndarray,
    window: int,
    scale: float,
    out: np.ndarray,
) -> None:
    n_tok, n_heads, dim = q.shape
    n_kv = k_bits.shape[1]
    group = n_heads // n_kv
    first = np.empty(n_tok, np.int64)  # token t's visible cells start here
    chunk_start = np.zeros(n_tok + 1, np.int64)  # token t owns chunks chunk_start[t] .. chunk_start[t+1]
    for t in range(n_tok):
        end = positions[t] + 1
        first[t] = max(0, end - window) if window > 0 else 0
        chunk_start[t + 1] = chunk_start[t] + (end - first[t] + KEY_CHUNK - 1) // KEY_CHUNK
    n_chunks = chunk_start[n_tok]
    chunk_token = np.empty(n_chunks, np.int64)
    for t in range(n_tok):
        chunk_token[chunk_start[t] : chunk_start[t + 1]] = t
    part_max = np.empty((n_chunks, n_heads), np.float32)
    part_sum = np.empty((n_chunks, n_heads), np.float32)
    part_out = np.empty((n_chunks, n_heads, dim), np.float32)
    # Each job reads its chunk of one kv head once, for all the query heads that share it.
    for job in prange(n_chunks * n_kv):
        c = job // n_kv
        kv_h = job - c * n_kv
        t = chunk_token[c]
        lo = first[t] + (c - chunk_start[t]) * KEY_CHUNK
        hi = min(lo + KEY_CHUNK, positions[t] + 1)
        keys = k_bits[seq_ids[t], kv_h]
        values = v_bits[seq_ids[t], kv_h]
        h0 = kv_h * group
        _attend_chunk(
            q[t, h0 : h0 + group],
            keys,
            values,
            lo,
            hi,
            scale,
            part_max[c, h0:],
            part_sum[c, h0:],
            part_out[c, h0:],
        )
    for job in prange(n_tok * n_heads):
        t = job // n_heads
        h = job - t * n_heads
        _merge_chunks(
            part_max[chunk_start[t] : chunk_start[t + 1], h],
            part_sum[chunk_start[t] : chunk_start[t + 1], h],
            part_out[chunk_start[t] : chunk_start[t + 1], h],
            out[t, h],
        )


@njit(**_KERNEL)
def _attend_chunk(
    q: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    lo: int,
    hi: int,
    scale: float,
    part_max: np.ndarray,
    part_sum: np.ndarray,
    part_out: np.ndarray,
) -> None:
    """Softmax-weighted sum of cells lo..hi for the query heads q[g]: per head its max score, the sum
    of exp(score - max) and the unnormalised output (merged over chunks by _merge_chunks).

    Cells go four at a time, each four read from memory once for all the query heads: one pass over
    the head dimension serves four dot products (or four value rows), which keeps the work in vector
    registers.
    """
    group, dim = q.shape
    n = hi - lo
    n4 = n // 4 * 4
    sc = np.float32(scale)
    scores = np.empty((group, n), np.float32)
    for j in range(0, n4, 4):
        for g in range(group):
            a0, a1, a2, a3 = _dot4(q[g], keys, lo + j)
            scores[g, j], scores[g, j + 1], scores[g, j + 2], scores[g, j + 3] = a0, a1, a2, a3
    for j in range(n4, n):
        for g in range(group):
            acc = F0
            for i in range(dim):
                acc += q[g, i] * half_to_float(keys[lo + j, i])
            scores[g, j] = acc
    for g in range(group):
        best = np.float32(-np.inf)
        for j in range(n):
            scores[g, j] *= sc
            best = max(best, scores[g, j])
        total = F0
        for j in range(n):
            e = exp(scores[g, j] - best)
            scores[g, j] = e
            total += e
        part_max[g] = best
        part_sum[g] = total
    part_out[:group] = F0
    for j in range(0, n4, 4):
        for g in range(group):
            _add_rows4(part_out[g], scores[g, j : j + 4], values, lo + j)
    for j in range(n4, n):
        for g in range(group):
            p = scores[g, j]
            for i in range(dim):
                part_out[g, i] += p * half_to_float(values[lo + j, i])


@njit(inline="always", **_KERNEL)
def _dot4(q: np.ndarray, cells: np.ndarray, c: int) -> tuple[float, float, float, float]:
    """q . cells[c + k] for k = 0..3 (cells hold half-precision bits)."""
    a0, a1, a2, a3 = F0, F0, F0, F0
    for i in range(q.shape[0]):
        qi = q[i]
        a0 += qi * half_to_float(cells[c, i])
        a1 += qi * half_to_float(cells[c + 1, i])
        a2 += qi * half_to_float(cells[c + 2, i])
        a3 += qi * half_to_float(cells[c + 3, i])
    return a0, a1, a2, a3


@njit(inline="always", **_KERNEL)
def _add_rows4(out: np.ndarray, p: np.ndarray, cells: np.ndarray, c: int) -> None:
    """out += sum_k p[k] * cells[c + k] for k = 0..3 (cells hold half-precision bits)."""
    p0, p1, p2, p3 = p[0], p[1], p[2], p[3]
    for i in range(out.shape[0]):
        out[i] += (
            p0 * half_to_float(cells[c, i])
            + p1 * half_to_float(cells[c + 1, i])
            + p2 * half_to_float(cells[c + 2, i])
            + p3 * half_to_float(cells[c + 3, i])
        )


@njit(**_KERNEL)
def _merge_chunks(part_max: np.ndarray, part_sum: np.ndarray, part_out: np.ndarray, out: np.ndarray) -> None:
    """out = the normalised attention output from its chunks' (max, sum, unnormalised output)."""
    best = part_max.max()
    total = F0
    out[:] = F0
    for c in range(part_max.shape[0]):
        w = exp(part_max[c] - best)
        total += part_sum[c] * w
        for i in range(out.shape[0]):
            out[i] += part_out[c, i] * w
    inv = F1 / total
    for i in range(out.shape[0]):
        out[i] *= inv


@njit(**_KERNEL)
def silu_mul(gate: np.ndarray, up: np.ndarray, out: np.ndarray) -> None:
    """out = silu(gate) * up (SwiGLU), over 2-D arrays."""
    rows, dim = gate.shape
    for r in range(rows):
        for i in range(dim):
            g = gate[r, i]
            out[r, i] = g / (F1 + exp(-g)) * up[r, i]


@njit(**_KERNEL)
def gelu_mul(gate: np.ndarray, up: np.ndarray, out: np.ndarray) -> None:
    """out = gelu(gate) * up with GELU's tanh approximation (as ggml computes it), over 2-D arrays."""
    rows, dim = gate.shape
    c = np.float32(math.sqrt(2.0 / math.pi))
    for r in range(rows):
        for i in range(dim):
            g = gate[r, i]
            inner = c * g * (F1 + np.float32(0.044715) * g * g)
            # tanh through exp: math.tanh is a scalar libm call, this vectorises
            tanh = F1 - np.float32(2.0) / (exp(np.float32(2.0) * inner) + F1)
            out[r, i] = np.float32(0.5) * g * (F1 + tanh) * up[r, i]


@njit(**_KERNEL)
def add_inplace(x: np.ndarray, y: np.ndarray) -> None:
    """x += y over 2-D arrays (the residual stream)."""
    rows, dim = x.shape
    for r in range(rows):
        for i in range(dim):
            x[r, i] += y[r, i]


@njit(**_KERNEL)
def scale_inplace(x: np.ndarray, factor: float) -> None:
    rows, dim = x.shape
    f = np.float32(factor)
    for r in range(rows):
        for i in range(dim):
            x[r, i] *= f
