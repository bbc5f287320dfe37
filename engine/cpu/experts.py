"""The CPU backend's mixture-of-experts pieces: expert tensors packed on first use with a view per
expert (engine/cpu/lazy_experts.py), the router's float matmul, bitwise independent of the batch (lane
sums as LLVM vectors, `_lane_sums`), the experts' outputs combined without numpy's copies, and gpt-oss's
clamped SwiGLU.

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
from llvmlite import ir
from numba import carray, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.cpu.lanes import ORDERED
from engine.cpu.lazy_experts import LazyExperts, expert_view
from engine.cpu.matmul.tiles import _alloca_f32
from engine.cpu.records import pack_weight_for_cpu
from engine.cpu.vecmath import exp
from engine.quant import ROWS, dequantize

_KERNEL = {"cache": True, "nogil": True, "error_model": "numpy"}
LANES = 16
_V16F32 = ir.VectorType(ir.FloatType(), LANES)


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


ROUTER_TILE = 4  # experts a call, beside ROUTER_TOKENS tokens: 8 vectors of lane sums
ROUTER_TOKENS = 2


def _lane_sums(n_rows: int, n_toks: int):  # type: ignore[no-untyped-def]
    """An intrinsic: lanes[i * n_rows + j, l] = the sum over k < n_body, k = l (mod 16), in order, of
    x[t + i, k] * w[e0 + j, k] (i < n_toks, j < n_rows), each product rounded then added (IEEE fmul and
    fadd, no contraction), as 16-float vectors."""

    @intrinsic
    def lane_sums(typingctx, lanes, x, t, w, e0, n_body):  # type: ignore[no-untyped-def]
        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            lanes_type, x_type, _, w_type, _, _ = sig.args
            t, e0, n_body = (context.cast(builder, args[i], sig.args[i], types.intp) for i in (2, 4, 5))
            i64 = ir.IntType(64)
            arrays = [context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 1, 3)]
            zero = ir.Constant(_V16F32, [0.0] * LANES)
            sums = [cgutils.alloca_once_value(builder, zero) for _ in range(n_rows * n_toks)]

            def at(array_type, array, row, col):  # type: ignore[no-untyped-def]
                index = [builder.add(row[0], ir.Constant(i64, row[1])), col]
                ptr = cgutils.get_item_pointer(context, builder, array_type, array, index, wraparound=False)
                return builder.bitcast(ptr, _V16F32.as_pointer())

            steps = builder.udiv(n_body, ir.Constant(i64, LANES))
            with cgutils.for_range(builder, steps) as loop:
                k = builder.mul(loop.index, ir.Constant(i64, LANES))
                xs = [builder.load(at(x_type, arrays[1], (t, i), k), align=4) for i in range(n_toks)]
                for j in range(n_rows):
                    wv = builder.load(at(w_type, arrays[2], (e0, j), k), align=4)
                    for i, xv in enumerate(xs):
                        s = sums[i * n_rows + j]
                        builder.store(builder.fadd(builder.load(s), builder.fmul(xv, wv)), s)
            zero64 = ir.Constant(i64, 0)
            for n, s in enumerate(sums):
                builder.store(builder.load(s), at(lanes_type, arrays[0], (zero64, n), zero64), align=4)
            return context.get_dummy_value()

        return types.void(lanes, x, t, w, e0, n_body), codegen

    return lane_sums


_LANE_SUMS = {
    (rows, toks): _lane_sums(rows, toks) for rows in (1, ROUTER_TILE) for toks in (1, ROUTER_TOKENS)
}
_sums_tile_pair, _sums_tile = _LANE_SUMS[ROUTER_TILE, ROUTER_TOKENS], _LANE_SUMS[ROUTER_TILE, 1]
_sums_one_pair, _sums_one = _LANE_SUMS[1, ROUTER_TOKENS], _LANE_SUMS[1, 1]


@njit(inline="always")
def _router_dots(x, t, w, e0, n_rows, n_toks, lanes, out):  # type: ignore[no-untyped-def]
    """out[t + i, e0 + j] for i < n_toks, j < n_rows (constants after inlining): the lane sums, the tail
    past the last whole 16 into lanes 0.., then the lanes added in order."""
    n = x.shape[1]
    body = n - n % LANES
    if n_rows == ROUTER_TILE and n_toks == ROUTER_TOKENS:
        _sums_tile_pair(lanes, x, t, w, e0, body)
    elif n_rows == ROUTER_TILE:
        _sums_tile(lanes, x, t, w, e0, body)
    elif n_toks == ROUTER_TOKENS:
        _sums_one_pair(lanes, x, t, w, e0, body)
    else:
        _sums_one(lanes, x, t, w, e0, body)
    for i in range(n_toks):
        for j in range(n_rows):
            row = lanes[i * n_rows + j]
            for k in range(body, n):
                row[k - body] += x[t + i, k] * w[e0 + j, k]
            total = np.float32(0.0)
            for lane in range(LANES):
                total += row[lane]
            out[t + i, e0 + j] = total


@njit(inline="always")
def _router_tokens(x, t, w, n_toks, lanes, out):  # type: ignore[no-untyped-def]
    n_expert = w.shape[0]
    whole = n_expert - n_expert % ROUTER_TILE
    for e0 in range(0, whole, ROUTER_TILE):
        _router_dots(x, t, w, e0, ROUTER_TILE, n_toks, lanes, out)
    for e in range(whole, n_expert):
        _router_dots(x, t, w, e, 1, n_toks, lanes, out)


# Every (token, expert) dot product is the same arithmetic in any tile: lane l sums the products at k = l
# (mod 16) in order, then the lanes in order (what the scalar-lane loop before did, bitwise). As such a
# loop LLVM did not vectorize it: 512 tokens x 256 experts x 2048 (Qwen3.6-35B-A3B's router), one
# thread, thread CPU time (Xeon VM of 2026-12-06): 81 ms; 4 experts a call 20.7 ms; 2 tokens x 4
# experts 11.7 ms (avx2 15.9, portable 21.2: every level the same bits as the loop's).
@njit(parallel=True, **_KERNEL)
def _router_logits(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    n_tok = x.shape[0]
    for pair in prange((n_tok + 1) // ROUTER_TOKENS):
        lanes = carray(_alloca_f32(128), (ROUTER_TILE * ROUTER_TOKENS, LANES))
        t = pair * ROUTER_TOKENS
        if t + ROUTER_TOKENS <= n_tok:
            _router_tokens(x, t, w, ROUTER_TOKENS, lanes, out)
        else:
            _router_tokens(x, t, w, 1, lanes, out)


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


def combine_experts(parts: list[np.ndarray], rows: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Backend.combine_experts on the CPU: out[t] = the sum over i of y[rows[t, i]] * weights[t, i] (y the
    parts' rows one after another), each product rounded and added in rank order, as numpy's
    `Backend._combine_experts` and llama.cpp: bitwise the same, without its copies (the parts joined,
    one gathered copy a rank)."""
    if weights.dtype != np.float32 or any(p.dtype != np.float32 for p in parts) or len(parts) > 2:
        y = np.concatenate(parts)  # numpy's arithmetic (types promoted as it promotes them)
        out = y[rows[:, 0]] * weights[:, :1]
        for i in range(1, rows.shape[1]):
            out += y[rows[:, i]] * weights[:, i : i + 1]
        return out
    shared = parts[1] if len(parts) == 2 else parts[0][:0]
    out = np.empty((rows.shape[0], parts[0].shape[1]), np.float32)
    _combine(parts[0], shared, np.ascontiguousarray(rows, dtype=np.int64), weights, out)
    return out


# No fastmath: a product rounded, then added (contracted into an FMA the sums would differ from numpy's).
# 512 tokens of Qwen3.6-35B-A3B (8 routed experts and the shared one, 2048 wide), one thread, thread CPU
# time: numpy's 19.6 ms (106 ms a layer inside a whole prefill, its 33 MB copies fresh pages), this 3.3.
@njit(parallel=True, cache=True, nogil=True)
def _combine(
    y: np.ndarray, shared: np.ndarray, rows: np.ndarray, weights: np.ndarray, out: np.ndarray
) -> None:
    n_tok, k = rows.shape
    n_y, n = y.shape[0], y.shape[1]
    for t in prange(n_tok):
        o = out[t]
        for i in range(k):
            r, w = rows[t, i], weights[t, i]
            src = y[r] if r < n_y else shared[r - n_y]
            if i == 0:
                for c in range(n):
                    o[c] = src[c] * w
            else:
                for c in range(n):
                    o[c] = o[c] + src[c] * w
