"""Element-wise and attention kernels for the CPU: RMSNorm, RoPE, attention over the KV cache, activations.

All work in float32 on C-contiguous arrays and write into caller-owned outputs. Shapes use T for the
number of tokens in the batch (prefill chunks and decode tokens of several sequences, mixed).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from engine.cpu.attention import attention, store_kv
from engine.cpu.vecmath import exp

# error_model "numpy": a float division may give inf instead of raising, so loops that divide vectorise.
_KERNEL = {"cache": True, "nogil": True, "fastmath": True, "error_model": "numpy"}
__all__ = [
    "add_bias_inplace",
    "add_inplace",
    "attention",
    "gelu_mul",
    "rmsnorm",
    "rope",
    "scale_inplace",
    "silu_mul",
    "store_kv",
]
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
def rope(
    x: np.ndarray, positions: np.ndarray, freq_base: float, neox: bool, pair_scale: np.ndarray, mscale: float
) -> None:
    """Rotary position embedding in place on x[T, n_heads, head_dim], over its first n_rot dimensions.

    n_rot = 2 * len(pair_scale); dimensions past it are left as they are (partial rotary, Phi-4-mini).
    Angles follow ggml: theta_0 = position, theta_{i+1} = theta_i * base^(-2/n_rot), in float32; pair i
    turns by theta_i * pair_scale[i] (1 without RoPE scaling; llama3's 1/freq_factor, YaRN's mix) and
    cos/sin are scaled by `mscale` (YaRN's and LongRoPE's attention factor, 1 without).
    `neox` rotates the pairs (i, i + n_rot/2); otherwise consecutive pairs (2i, 2i+1) ("normal" mode).
    """
    n_tok, n_heads, _ = x.shape
    half = pair_scale.shape[0]
    theta_scale = np.float32(freq_base) ** np.float32(-1.0 / half)
    cos_t = np.empty(half, dtype=np.float32)
    sin_t = np.empty(half, dtype=np.float32)
    m = np.float32(mscale)
    for t in range(n_tok):
        theta = np.float32(positions[t])
        for i in range(half):
            angle = theta * pair_scale[i]
            cos_t[i] = np.float32(math.cos(angle)) * m
            sin_t[i] = np.float32(math.sin(angle)) * m
            theta *= theta_scale
        for h in range(n_heads):
            for i in range(half):
                a = 2 * i if not neox else i
                b = a + 1 if not neox else i + half
                x0 = x[t, h, a]
                x1 = x[t, h, b]
                x[t, h, a] = x0 * cos_t[i] - x1 * sin_t[i]
                x[t, h, b] = x0 * sin_t[i] + x1 * cos_t[i]


def silu_mul(gate: np.ndarray, up: np.ndarray, out: np.ndarray) -> None:
    """out = silu(gate) * up (SwiGLU), over 2-D arrays; out may be gate."""
    if out is not gate:
        out[...] = gate
    _silu_mul_inplace(out, up)


def gelu_mul(gate: np.ndarray, up: np.ndarray, out: np.ndarray) -> None:
    """out = gelu(gate) * up with GELU's tanh approximation (as ggml computes it); out may be gate."""
    if out is not gate:
        out[...] = gate
    _gelu_mul_inplace(out, up)


# In place on purpose: with a separate output that may be the input, LLVM's run-time overlap check
# sends the exact in-place call (the one the models make) down its scalar loop, 10x slower.


@njit(**_KERNEL)
def _silu_mul_inplace(gate: np.ndarray, up: np.ndarray) -> None:
    rows, dim = gate.shape
    for r in range(rows):
        for i in range(dim):
            g = gate[r, i]
            gate[r, i] = g / (F1 + exp(-g)) * up[r, i]


@njit(**_KERNEL)
def _gelu_mul_inplace(gate: np.ndarray, up: np.ndarray) -> None:
    rows, dim = gate.shape
    c = np.float32(math.sqrt(2.0 / math.pi))
    for r in range(rows):
        for i in range(dim):
            g = gate[r, i]
            inner = c * g * (F1 + np.float32(0.044715) * g * g)
            # tanh through exp: math.tanh is a scalar libm call, this vectorises
            tanh = F1 - np.float32(2.0) / (exp(np.float32(2.0) * inner) + F1)
            gate[r, i] = np.float32(0.5) * g * (F1 + tanh) * up[r, i]


@njit(**_KERNEL)
def add_inplace(x: np.ndarray, y: np.ndarray) -> None:
    """x += y over 2-D arrays (the residual stream)."""
    rows, dim = x.shape
    for r in range(rows):
        for i in range(dim):
            x[r, i] += y[r, i]


@njit(**_KERNEL)
def add_bias_inplace(x: np.ndarray, bias: np.ndarray) -> None:
    """x[r] += bias for every row r of a 2-D x (Qwen2's Q/K/V projection biases)."""
    rows, dim = x.shape
    for r in range(rows):
        for i in range(dim):
            x[r, i] += bias[i]


@njit(**_KERNEL)
def scale_inplace(x: np.ndarray, factor: float) -> None:
    rows, dim = x.shape
    f = np.float32(factor)
    for r in range(rows):
        for i in range(dim):
            x[r, i] *= f
