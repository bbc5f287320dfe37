"""Element-wise and attention kernels for the CPU: RMSNorm, RoPE, attention over the KV cache, activations.

All work in float32 on C-contiguous arrays and write into caller-owned outputs. Shapes use T for the
number of tokens in the batch (prefill chunks and decode tokens of several sequences, mixed).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from engine.cpu.attention import attention, store_kv
from engine.cpu.f16 import float_to_half
from engine.cpu.lanes import ORDERED
from engine.cpu.vecmath import exp

# error_model "numpy": a float division may give inf instead of raising, so loops that divide vectorise.
_KERNEL = {"cache": True, "nogil": True, "fastmath": ORDERED, "error_model": "numpy"}
__all__ = [
    "add_bias_inplace",
    "add_inplace",
    "attention",
    "gelu",
    "gelu_mul",
    "layernorm",
    "rmsnorm",
    "rope",
    "scale_inplace",
    "silu_mul",
    "store_kv",
]
F0 = np.float32(0.0)
F1 = np.float32(1.0)


# Rows from which a norm runs on every thread: llama.cpp's sequential sum is ~0.35 ns a value, 0.19 ms for
# 512 of SmolLM2's rows on one thread (0.055 ms reassociated).
PARALLEL_NORM_ROWS = 64


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray) -> None:
    """out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, for every row r of a 2-D x; out may be x."""
    if x.shape[0] >= PARALLEL_NORM_ROWS:
        _rmsnorm_parallel(x, weight, np.float32(eps), out)
    else:
        _rmsnorm_serial(x, weight, np.float32(eps), out)


# IEEE arithmetic in llama.cpp's order (ggml_compute_forward_rms_norm_f32, then the weight's ggml_mul): each
# square rounded to float32, summed in float64 one after the other, the mean rounded to float32,
# 1 / sqrtf(mean + eps), then (x * scale) * weight. Under fastmath LLVM summed the squares in float32
# lanes as wide as the target's vectors: Gemma 3's norms then differed from llama.cpp's (and between
# avx512-vnni and avx2) in the last bit, flipping the next matmul's int8 roundings.
@njit(inline="always", cache=True, nogil=True, error_model="numpy")
def _norm_row(x: np.ndarray, r: int, weight: np.ndarray, eps: np.float32, out: np.ndarray) -> None:
    dim = x.shape[1]
    ss = 0.0
    for i in range(dim):
        ss += np.float64(x[r, i] * x[r, i])
    scale = F1 / np.sqrt(np.float32(ss / dim) + eps)
    for i in range(dim):
        out[r, i] = x[r, i] * scale * weight[i]


@njit(cache=True, nogil=True, error_model="numpy")
def _rmsnorm_serial(x: np.ndarray, weight: np.ndarray, eps: np.float32, out: np.ndarray) -> None:
    for r in range(x.shape[0]):
        _norm_row(x, r, weight, eps, out)


@njit(parallel=True, cache=True, nogil=True, error_model="numpy")
def _rmsnorm_parallel(x: np.ndarray, weight: np.ndarray, eps: np.float32, out: np.ndarray) -> None:
    for r in prange(x.shape[0]):
        _norm_row(x, r, weight, eps, out)


def layernorm(
    x: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None, eps: float, out: np.ndarray
) -> None:
    """out[r] = (x[r] - mean) / sqrt(var + eps) * weight + bias for every row r of a 2-D x (BERT's
    LayerNorm; weight and bias may be None: ModernBERT's have no bias); out may be x."""
    ones = weight if weight is not None else np.ones(x.shape[1], np.float32)
    zeros = bias if bias is not None else np.zeros(x.shape[1], np.float32)
    if x.shape[0] >= PARALLEL_NORM_ROWS:
        _layernorm_parallel(x, ones, zeros, np.float32(eps), out)
    else:
        _layernorm_serial(x, ones, zeros, np.float32(eps), out)


# llama.cpp's order (ggml_compute_forward_norm_f32, then the weight's ggml_mul and the bias's ggml_add):
# the mean of a float64 sum in order, rounded to float32; each x - mean in float32, its square summed in
# float64; 1 / sqrtf(variance + eps); ((x - mean) * scale) * weight + bias.
@njit(inline="always", cache=True, nogil=True, error_model="numpy")
def _layernorm_row(
    x: np.ndarray, r: int, weight: np.ndarray, bias: np.ndarray, eps: np.float32, out: np.ndarray
) -> None:
    dim = x.shape[1]
    total = 0.0
    for i in range(dim):
        total += np.float64(x[r, i])
    mean = np.float32(total / dim)
    ss = 0.0
    for i in range(dim):
        d = x[r, i] - mean
        ss += np.float64(d * d)
    scale = F1 / np.sqrt(np.float32(ss / dim) + eps)
    for i in range(dim):
        out[r, i] = (x[r, i] - mean) * scale * weight[i] + bias[i]


@njit(cache=True, nogil=True, error_model="numpy")
def _layernorm_serial(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: np.float32, out: np.ndarray
) -> None:
    for r in range(x.shape[0]):
        _layernorm_row(x, r, weight, bias, eps, out)


@njit(parallel=True, cache=True, nogil=True, error_model="numpy")
def _layernorm_parallel(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: np.float32, out: np.ndarray
) -> None:
    for r in prange(x.shape[0]):
        _layernorm_row(x, r, weight, bias, eps, out)


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
    (_silu_mul_parallel if len(gate) >= PARALLEL_NORM_ROWS else _silu_mul_inplace)(out, up)


def _gelu_table() -> np.ndarray:
    """GELU (tanh approximation, float32) of every float16 value, rounded to float16: ggml's
    ggml_table_gelu_f16, which its CPU GELU reads (GGML_GELU_FP16) instead of evaluating the formula."""
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        inner = np.float32(math.sqrt(2.0 / math.pi)) * x * (F1 + np.float32(0.044715) * x * x)
        y = np.float32(0.5) * x * (F1 + np.tanh(inner))
    return y.astype(np.float16).astype(np.float32)


GELU_TABLE = _gelu_table()


def gelu_mul(gate: np.ndarray, up: np.ndarray, out: np.ndarray) -> None:
    """out = gelu(gate) * up as ggml's CPU GELU: the float16 table lookup; out may be gate."""
    if out is not gate:
        out[...] = gate
    (_gelu_mul_parallel if len(gate) >= PARALLEL_NORM_ROWS else _gelu_mul_inplace)(out, up, GELU_TABLE)


def gelu(x: np.ndarray, out: np.ndarray) -> None:
    """out = gelu(x) as ggml's CPU GELU (the float16 table; BERT's feed-forward); out may be x."""
    if out is not x:
        out[...] = x
    (_gelu_parallel if len(x) >= PARALLEL_NORM_ROWS else _gelu_inplace)(out, GELU_TABLE)


# In place on purpose: with a separate output that may be the input, LLVM's run-time overlap check
# sends the exact in-place call (the one the models make) down its scalar loop, 10x slower. Rows split
# over the threads from PARALLEL_NORM_ROWS on (a prompt, an encoder's pass): the GELU of MiniLM's pass of
# 4 x 128 tokens took 9.9 ms of its 172 on one thread (2026-12-07, 2 cores).


@njit(inline="always", **_KERNEL)
def _silu_mul_row(gate: np.ndarray, up: np.ndarray, r: int) -> None:
    for i in range(gate.shape[1]):
        g = gate[r, i]
        gate[r, i] = g / (F1 + exp(-g)) * up[r, i]


@njit(inline="always", **_KERNEL)
def _gelu_mul_row(gate: np.ndarray, up: np.ndarray, table: np.ndarray, r: int) -> None:
    for i in range(gate.shape[1]):
        g = gate[r, i]
        if g <= np.float32(-10.0):
            gate[r, i] = F0
        elif g >= np.float32(10.0):
            gate[r, i] = g * up[r, i]
        else:
            gate[r, i] = table[float_to_half(g)] * up[r, i]


@njit(inline="always", **_KERNEL)
def _gelu_row(x: np.ndarray, table: np.ndarray, r: int) -> None:
    for i in range(x.shape[1]):
        g = x[r, i]
        if g <= np.float32(-10.0):
            x[r, i] = F0
        elif g < np.float32(10.0):
            x[r, i] = table[float_to_half(g)]


@njit(**_KERNEL)
def _silu_mul_inplace(gate: np.ndarray, up: np.ndarray) -> None:
    for r in range(gate.shape[0]):
        _silu_mul_row(gate, up, r)


@njit(parallel=True, **_KERNEL)
def _silu_mul_parallel(gate: np.ndarray, up: np.ndarray) -> None:
    for r in prange(gate.shape[0]):
        _silu_mul_row(gate, up, r)


@njit(**_KERNEL)
def _gelu_mul_inplace(gate: np.ndarray, up: np.ndarray, table: np.ndarray) -> None:
    for r in range(gate.shape[0]):
        _gelu_mul_row(gate, up, table, r)


@njit(parallel=True, **_KERNEL)
def _gelu_mul_parallel(gate: np.ndarray, up: np.ndarray, table: np.ndarray) -> None:
    for r in prange(gate.shape[0]):
        _gelu_mul_row(gate, up, table, r)


@njit(**_KERNEL)
def _gelu_inplace(x: np.ndarray, table: np.ndarray) -> None:
    for r in range(x.shape[0]):
        _gelu_row(x, table, r)


@njit(parallel=True, **_KERNEL)
def _gelu_parallel(x: np.ndarray, table: np.ndarray) -> None:
    for r in prange(x.shape[0]):
        _gelu_row(x, table, r)


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
