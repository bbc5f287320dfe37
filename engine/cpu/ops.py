"""Element-wise and attention kernels for the CPU: RMSNorm, RoPE, attention over the KV cache, activations.

All work in float32 on C-contiguous arrays and write into caller-owned outputs. Shapes use T for the
number of tokens in the batch (prefill chunks and decode tokens of several sequences, mixed).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

_KERNEL = {"cache": True, "nogil": True, "fastmath": True}
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
def store_kv(
    k: np.ndarray,
    v: np.ndarray,
    seq_ids: np.ndarray,
    positions: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
) -> None:
    """Write k/v[T, n_kv_heads, head_dim] into the caches [n_seq, n_kv_heads, n_ctx, head_dim]."""
    n_tok, n_kv, _ = k.shape
    for t in range(n_tok):
        for h in range(n_kv):
            k_cache[seq_ids[t], h, positions[t], :] = k[t, h, :]
            v_cache[seq_ids[t], h, positions[t], :] = v[t, h, :]


@njit(parallel=True, **_KERNEL)
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
    """Causal attention of q[T, n_heads, head_dim] over the cached keys/values of each token's sequence.

    Token t attends to cache cells 0..positions[t] of its sequence (the batch's own k/v are already
    stored). With window > 0 only the last `window` positions are visible (sliding-window layers).
    Grouped-query: query head h reads kv head h // (n_heads / n_kv_heads).
    """
    n_tok, n_heads, dim = q.shape
    group = n_heads // k_cache.shape[1]
    sc = np.float32(scale)
    for job in prange(n_tok * n_heads):
        t = job // n_heads
        h = job % n_heads
        kv_h = h // group
        s = seq_ids[t]
        end = positions[t] + 1
        start = max(0, end - window) if window > 0 else 0
        scores = np.empty(end - start, dtype=np.float32)
        best = np.float32(-np.inf)
        for j in range(start, end):
            acc = F0
            for i in range(dim):
                acc += q[t, h, i] * k_cache[s, kv_h, j, i]
            acc *= sc
            scores[j - start] = acc
            best = max(best, acc)
        total = F0
        for j in range(end - start):
            e = np.float32(math.exp(scores[j] - best))
            scores[j] = e
            total += e
        inv = F1 / total
        for i in range(dim):
            out[t, h, i] = F0
        for j in range(start, end):
            p = scores[j - start] * inv
            for i in range(dim):
                out[t, h, i] += p * v_cache[s, kv_h, j, i]


@njit(**_KERNEL)
def silu_mul(gate: np.ndarray, up: np.ndarray, out: np.ndarray) -> None:
    """out = silu(gate) * up (SwiGLU), over 2-D arrays."""
    rows, dim = gate.shape
    for r in range(rows):
        for i in range(dim):
            g = gate[r, i]
            out[r, i] = g / (F1 + np.float32(math.exp(-g))) * up[r, i]


@njit(**_KERNEL)
def gelu_mul(gate: np.ndarray, up: np.ndarray, out: np.ndarray) -> None:
    """out = gelu(gate) * up with GELU's tanh approximation (as ggml computes it), over 2-D arrays."""
    rows, dim = gate.shape
    c = np.float32(math.sqrt(2.0 / math.pi))
    for r in range(rows):
        for i in range(dim):
            g = gate[r, i]
            inner = c * g * (F1 + np.float32(0.044715) * g * g)
            out[r, i] = np.float32(0.5) * g * (F1 + np.float32(math.tanh(inner))) * up[r, i]


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
