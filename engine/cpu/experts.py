"""The CPU backend's mixture-of-experts pieces: expert tensors packed on first use with a view per
expert (engine/cpu/lazy_experts.py), the router's float matmul, bitwise independent of the batch, and
gpt-oss's clamped SwiGLU.

A `*_exps` tensor is 3-D (expert, rows, cols), packed as one (expert x rows, cols) matrix whose expert
e is a contiguous slice of row groups: one mapping per tensor instead of one per expert (a
Qwen3-30B-A3B layer has 128 experts of about 1.7 MB each, each of which would round up to a 2 MiB
huge-page mapping of its own), and one array the one-call expert kernels index
(engine/cpu/matmul/experts.py).

The router (`ffn_gate_inp`, float32 in every release: llama-quantize leaves it so) is small (n_expert x
n_embd), but its logits choose the experts and weigh their outputs, so a last-bit difference changes a
token's output. The float matmul kernel's tiles of different sizes differ in their last bits (FMA
contraction differs between its inlined tile copies), so a token's logits there depend on how many
tokens share its call. `router_logits` computes every (token, expert) dot product by the same code
whatever the batch: 16 lane sums over the row, then the lanes added in order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit, prange

from engine.cpu.lanes import ORDERED
from engine.cpu.lazy_experts import LazyExperts, expert_view
from engine.cpu.records import pack_weight_for_cpu
from engine.cpu.vecmath import exp
from engine.quant import ROWS, dequantize

_KERNEL = {"cache": True, "nogil": True, "error_model": "numpy"}
LANES = 16


def pack_experts_for_cpu(
    parts: list[np.ndarray], qtype: int, shape: tuple[int, int, int]
) -> tuple[list[Any], list[Any], Callable[[np.ndarray], None] | None]:
    """(the packed weights that hold the experts, one weight per expert, `prepare`) of a 3-D tensor's
    stored rows, `parts` (each (experts, rows_i, bytes per row), fused along the rows: gate|up). Experts
    are packed on first use: prepare(experts) packs those of them not packed yet, and must run before a
    kernel reads them. Rows that are not a multiple of 32 would share a row group between two experts:
    those experts are packed one by one, at once (prepare None)."""
    n_expert, rows, cols = shape
    if rows % ROWS:
        data = np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]
        each = [pack_weight_for_cpu(data[e], qtype, (rows, cols)) for e in range(n_expert)]
        return each, each, None
    lazy = LazyExperts(parts, qtype, shape)
    return [lazy.whole], [expert_view(lazy.whole, e, rows) for e in range(n_expert)], lazy.prepare


def pack_router_for_cpu(data: np.ndarray, qtype: int, shape: tuple[int, int]) -> np.ndarray:
    """The router's matrix as float32 rows (n_expert, n_embd), whatever its stored type."""
    return np.ascontiguousarray(dequantize(data, qtype, shape), dtype=np.float32)


def router_logits(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """out[T, n_expert] = x[T, n_embd] @ w.T in float32, each row independent of the others."""
    if x.shape[1] != w.shape[1] or out.shape != (x.shape[0], w.shape[0]):
        raise ValueError(f"router shapes: x {x.shape}, w {w.shape}, out {out.shape}")
    _router_logits(np.ascontiguousarray(x), w, out)


@njit(parallel=True, **_KERNEL)
def _router_logits(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    n_tok, n_expert = out.shape
    for t in prange(n_tok):
        lanes = np.empty(LANES, np.float32)
        for e in range(n_expert):
            out[t, e] = _dot(x[t], w[e], lanes)


@njit(**_KERNEL)
def _dot(a: np.ndarray, b: np.ndarray, lanes: np.ndarray) -> np.float32:
    """a . b: lane l sums positions l, l + 16, ... (one vector of sums), then the lanes in order."""
    n = a.shape[0]
    lanes[:] = np.float32(0.0)
    body = n - n % LANES
    for k in range(0, body, LANES):
        for lane in range(LANES):
            lanes[lane] += a[k + lane] * b[k + lane]
    for k in range(body, n):
        lanes[k - body] += a[k] * b[k]
    total = np.float32(0.0)
    for lane in range(LANES):
        total += lanes[lane]
    return total


def swiglu_oai(gate: np.ndarray, up: np.ndarray, alpha: float, limit: float) -> None:
    """gate = gpt-oss's clamped SwiGLU of (gate, up), in place (ggml's swiglu_oai): x = min(gate, limit),
    y = clamp(up, -limit, limit), x * sigmoid(alpha * x) * (y + 1)."""
    _swiglu_oai(gate, up, np.float32(alpha), np.float32(limit))


@njit(fastmath=ORDERED, **_KERNEL)  # not fastmath=True: avx2 and avx512-vnni rounded it differently
def _swiglu_oai(gate: np.ndarray, up: np.ndarray, alpha: np.float32, limit: np.float32) -> None:
    one = np.float32(1.0)
    for r in range(gate.shape[0]):
        for i in range(gate.shape[1]):
            x = min(gate[r, i], limit)
            y = min(max(up[r, i], -limit), limit)
            gate[r, i] = x / (one + exp(-(alpha * x))) * (y + one)
