"""Element-wise, normalization and attention kernels for CUDA: the twins of engine/cpu/ops.py.

Same names, arguments and float32 semantics as the CPU kernels (outputs are caller-owned, T is the
number of tokens of a mixed batch). Reductions use shared memory and `syncthreads` only: the simulator
that runs the parity tests has no warp shuffles. No fastmath: RoPE angles reach thousands of radians,
where the fast `__cosf` is far off.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32
from numba.types import float16

from engine.cuda import kv_cells
from engine.cuda.arrays import blocks, device, elem_blocks, ids, write_back

MAX_THREADS = 256  # the most threads of a block that reduces through shared memory (a power of two)
MAX_HEAD_DIM = 256  # Gemma 3's head dimension; attention keeps q and the output row in shared memory
ROW_THREADS = 128  # threads per row for rmsnorm; per (token, head) for attention (powers of two)
ELEM_THREADS = 256  # threads per block of the element-wise kernels


# ---------------------------------------------------------------------------------------------------
# Block reductions over shared memory. `n` (the block size) is a power of two; every thread of the
# block calls them, and every thread gets the result.


@cuda.jit(device=True)
def block_sum(sm, tid, n):  # type: ignore[no-untyped-def]
    stride = n // 2
    while stride > 0:
        cuda.syncthreads()
        if tid < stride:
            sm[tid] += sm[tid + stride]
        stride //= 2
    cuda.syncthreads()
    total = sm[0]
    cuda.syncthreads()  # the caller may refill sm right away
    return total


@cuda.jit(device=True)
def block_max(sm, tid, n):  # type: ignore[no-untyped-def]
    stride = n // 2
    while stride > 0:
        cuda.syncthreads()
        if tid < stride:
            sm[tid] = max(sm[tid], sm[tid + stride])
        stride //= 2
    cuda.syncthreads()
    best = sm[0]
    cuda.syncthreads()
    return best


# ---------------------------------------------------------------------------------------------------
# Kernels. The `_py` functions are the sources; cuda-check compiles them for a fixed signature.


def _rmsnorm_py(x, weight, eps, out):  # type: ignore[no-untyped-def]
    """A block per row: the sum of squares reduced in shared memory, then the scaled row written."""
    sm = cuda.shared.array(MAX_THREADS, float32)
    tid = cuda.threadIdx.x
    n = cuda.blockDim.x
    dim = x.shape[1]
    for r in range(cuda.blockIdx.x, x.shape[0], cuda.gridDim.x):
        acc = float32(0.0)
        for i in range(tid, dim, n):
            v = x[r, i]
            acc += v * v
        sm[tid] = acc
        ss = block_sum(sm, tid, n)
        scale = float32(1.0) / math.sqrt(ss / float32(dim) + eps)
        for i in range(tid, dim, n):
            out[r, i] = x[r, i] * scale * weight[i]


def _rope_py(x, positions, theta_scale, neox, pair_scale, mscale):  # type: ignore[no-untyped-def]
    """A block per token, a thread per (head, pair) of the first n_rot = 2 * len(pair_scale) dimensions.
    The angle is built by the CPU kernel's repeated float32 multiplication (not a pow), so both backends
    rotate by the same angles."""
    n_heads = x.shape[1]
    half = pair_scale.shape[0]
    for t in range(cuda.blockIdx.x, x.shape[0], cuda.gridDim.x):
        for job in range(cuda.threadIdx.x, n_heads * half, cuda.blockDim.x):
            h = job // half
            i = job - h * half
            theta = float32(positions[t])
            for _ in range(i):
                theta *= theta_scale
            angle = theta * pair_scale[i]
            c = math.cos(angle) * mscale
            s = math.sin(angle) * mscale
            a = i if neox else 2 * i
            b = i + half if neox else 2 * i + 1
            x0 = x[t, h, a]
            x1 = x[t, h, b]
            x[t, h, a] = x0 * c - x1 * s
            x[t, h, b] = x0 * s + x1 * c


def _store_kv_py(k, v, seq_ids, positions, k_cache, v_cache):  # type: ignore[no-untyped-def]
    """A block per token: k/v[T, n_kv, dim] -> float16 caches [n_seq, n_kv, n_ctx, dim], the token's cell."""
    dim = k.shape[2]
    for t in range(cuda.blockIdx.x, k.shape[0], cuda.gridDim.x):
        s = seq_ids[t]
        p = positions[t]
        for job in range(cuda.threadIdx.x, k.shape[1] * dim, cuda.blockDim.x):
            h = job // dim
            i = job - h * dim
            k_cache[s, h, p, i] = float16(k[t, h, i])
            v_cache[s, h, p, i] = float16(v[t, h, i])


def _attention_kernel(load_k, load_v):  # type: ignore[no-untyped-def]
    """The attention kernel's source for a pair of cell readers (engine/cuda/kv_cells.py: f16, q8_0)."""

    def attention_py(q, k_cache, v_cache, seq_ids, positions, window, scale, out):  # type: ignore[no-untyped-def]
        """A block per (token, query head), keys taken blockDim at a time with an online softmax.

        Per chunk, thread j scores key j against q (kept in shared memory), the block reduces the
        chunk's maximum and sum, rescales the running output by exp(old max - new max), and thread i
        adds sum_j p_j * v[j, i] for the dimensions it owns. The visible cells are the CPU kernel's:
        positions 0..pos of the token's sequence, the last `window` of them when window > 0.
        Grouped-query heads read kv head h // (n_heads / n_kv_heads).
        """
        q_sm = cuda.shared.array(MAX_HEAD_DIM, float32)
        acc_sm = cuda.shared.array(MAX_HEAD_DIM, float32)
        p_sm = cuda.shared.array(MAX_THREADS, float32)
        red = cuda.shared.array(MAX_THREADS, float32)
        n_heads = q.shape[1]
        shared = (q_sm, acc_sm, p_sm, red)
        for job in range(cuda.blockIdx.x, q.shape[0] * n_heads, cuda.gridDim.x):
            attend_one(q, k_cache, v_cache, seq_ids, positions, window, scale, out, job, shared)
            cuda.syncthreads()  # q_sm and acc_sm are refilled by the next job

    @cuda.jit(device=True)
    def attend_one(q, k_cache, v_cache, seq_ids, positions, window, scale, out, job, shared):  # type: ignore[no-untyped-def]
        q_sm, acc_sm, p_sm, red = shared
        tid = cuda.threadIdx.x
        n = cuda.blockDim.x
        n_heads = q.shape[1]
        dim = q.shape[2]
        t = job // n_heads
        h = job - t * n_heads
        kv_h = h // (n_heads // k_cache.shape[1])
        s = seq_ids[t]
        end = positions[t] + 1
        start = max(0, end - window) if window > 0 else 0
        for i in range(tid, dim, n):
            q_sm[i] = q[t, h, i]
            acc_sm[i] = float32(0.0)
        cuda.syncthreads()
        run_max = float32(-math.inf)
        run_sum = float32(0.0)
        for c0 in range(start, end, n):
            j = c0 + tid
            score = float32(-math.inf)
            if j < end:
                dot = float32(0.0)
                for i in range(dim):
                    dot += q_sm[i] * load_k(k_cache, s, kv_h, j, i)
                score = dot * scale
            red[tid] = score
            new_max = max(run_max, block_max(red, tid, n))
            p = float32(0.0)
            if j < end:
                p = math.exp(score - new_max)
            p_sm[tid] = p
            red[tid] = p
            chunk_sum = block_sum(red, tid, n)  # its syncthreads also publish p_sm
            corr = math.exp(run_max - new_max)
            run_sum = run_sum * corr + chunk_sum
            n_valid = min(n, end - c0)
            for i in range(tid, dim, n):
                a = acc_sm[i] * corr
                for jj in range(n_valid):
                    a += p_sm[jj] * load_v(v_cache, s, kv_h, c0 + jj, i)
                acc_sm[i] = a
            run_max = new_max
            cuda.syncthreads()  # p_sm is refilled by the next chunk
        inv = float32(1.0) / run_sum
        for i in range(tid, dim, n):
            out[t, h, i] = acc_sm[i] * inv

    return attention_py


# The attention kernels' sources by (key type, value type); cuda-check compiles each.
_LOADS = {"f16": kv_cells.load_f16, "q8_0": kv_cells.load_q8_0}
ATTENTION_PY = {(k, v): _attention_kernel(_LOADS[k], _LOADS[v]) for k in _LOADS for v in _LOADS}
_attention_py = ATTENTION_PY[("f16", "f16")]


def _silu_mul_py(gate, up, out):  # type: ignore[no-untyped-def]
    dim = gate.shape[1]
    for e in range(cuda.grid(1), gate.shape[0] * dim, cuda.gridsize(1)):
        r = e // dim
        i = e - r * dim
        g = gate[r, i]
        out[r, i] = g / (float32(1.0) + math.exp(-g)) * up[r, i]


def _gelu_mul_py(gate, up, out):  # type: ignore[no-untyped-def]
    """GELU's tanh approximation, as ggml's CUDA backend computes it: the formula (ggml's CPU backend, and
    so engine/cpu/ops.py, reads a float16 table instead)."""
    dim = gate.shape[1]
    c = float32(math.sqrt(2.0 / math.pi))
    for e in range(cuda.grid(1), gate.shape[0] * dim, cuda.gridsize(1)):
        r = e // dim
        i = e - r * dim
        g = gate[r, i]
        inner = c * g * (float32(1.0) + float32(0.044715) * g * g)
        out[r, i] = float32(0.5) * g * (float32(1.0) + math.tanh(inner)) * up[r, i]


def _add_inplace_py(x, y):  # type: ignore[no-untyped-def]
    dim = x.shape[1]
    for e in range(cuda.grid(1), x.shape[0] * dim, cuda.gridsize(1)):
        r = e // dim
        i = e - r * dim
        x[r, i] += y[r, i]


def _add_bias_inplace_py(x, bias):  # type: ignore[no-untyped-def]
    dim = x.shape[1]
    for e in range(cuda.grid(1), x.shape[0] * dim, cuda.gridsize(1)):
        r = e // dim
        i = e - r * dim
        x[r, i] += bias[i]


def _scale_inplace_py(x, factor):  # type: ignore[no-untyped-def]
    dim = x.shape[1]
    for e in range(cuda.grid(1), x.shape[0] * dim, cuda.gridsize(1)):
        r = e // dim
        i = e - r * dim
        x[r, i] *= factor


_rmsnorm = cuda.jit(_rmsnorm_py)
_rope = cuda.jit(_rope_py)
_store_kv = cuda.jit(_store_kv_py)
_attention = {types: cuda.jit(source) for types, source in ATTENTION_PY.items()}
_silu_mul = cuda.jit(_silu_mul_py)
_gelu_mul = cuda.jit(_gelu_mul_py)
_add_inplace = cuda.jit(_add_inplace_py)
_add_bias_inplace = cuda.jit(_add_bias_inplace_py)
_scale_inplace = cuda.jit(_scale_inplace_py)


# ---------------------------------------------------------------------------------------------------
# Host entry points: the CPU kernels' signatures. Host arrays are uploaded and outputs written back.


def rmsnorm(x, weight, eps: float, out) -> None:  # type: ignore[no-untyped-def]
    """out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, for every row r of a 2-D x (out may be x)."""
    dx, dw = device(x), device(weight)
    dout = dx if out is x else device(out)
    if x.shape[0]:
        _rmsnorm[blocks(x.shape[0]), ROW_THREADS](dx, dw, np.float32(eps), dout)
    write_back(out, dout)


def rope(x, positions, freq_base: float, neox: bool, pair_scale, mscale: float) -> None:  # type: ignore[no-untyped-def]
    """Rotary position embedding in place on x[T, n_heads, head_dim] (see engine.cpu.ops.rope)."""
    half = pair_scale.shape[0]
    theta_scale = np.float32(freq_base) ** np.float32(-1.0 / half)  # the CPU kernel's float32 value
    dx = device(x)
    if x.shape[0]:
        _rope[blocks(x.shape[0]), ROW_THREADS](
            dx, ids(positions), np.float32(theta_scale), bool(neox), device(pair_scale), np.float32(mscale)
        )
    write_back(x, dx)


def store_kv(k, v, seq_ids, positions, k_cache, v_cache) -> None:  # type: ignore[no-untyped-def]
    """Write k/v[T, n_kv_heads, head_dim] into the caches [n_seq, n_kv_heads, n_ctx, row]: float16, or
    Q8_0 bytes (uint8) quantized as engine/cpu/kv_cells.py does."""
    dk, dv = device(k_cache), device(v_cache)
    if k.shape[0]:
        args = (ids(seq_ids), ids(positions))
        if dk.dtype == np.float16 and dv.dtype == np.float16:
            _store_kv[blocks(k.shape[0]), ROW_THREADS](device(k), device(v), *args, dk, dv)
        else:
            _store_cells(device(k), args, dk)
            _store_cells(device(v), args, dv)
    write_back(k_cache, dk)
    write_back(v_cache, dv)


def _store_cells(x, args, cache) -> None:  # type: ignore[no-untyped-def]
    """One of K or V into its cache, in the cache's type."""
    if cache.dtype == np.float16:
        # the f16 store kernel with x as both K and V: each cell is written twice with the same value
        _store_kv[blocks(x.shape[0]), ROW_THREADS](x, x, *args, cache, cache)
    else:
        kv_cells.store_q8_0[blocks(x.shape[0]), ROW_THREADS](x, *args, cache)


def _cell_type(cache) -> str:  # type: ignore[no-untyped-def]
    return "f16" if cache.dtype == np.float16 else "q8_0"


def attention(q, k_cache, v_cache, seq_ids, positions, window: int, scale: float, out, limits=None) -> None:  # type: ignore[no-untyped-def]
    """Causal attention of q[T, n_heads, head_dim] over each token's cached sequence (engine.cpu.ops).
    `limits` (non-causal media chunks) is the CPU kernel's alone: projectors run on the CPU backend."""
    if limits is not None:
        raise NotImplementedError("non-causal media chunks need the CPU backend")
    n_tok, n_heads, dim = q.shape
    if dim > MAX_HEAD_DIM:
        raise ValueError(f"attention: head_dim {dim} > {MAX_HEAD_DIM}")
    dout = device(out)
    if n_tok:
        dk, dv = device(k_cache), device(v_cache)
        kernel = _attention[(_cell_type(dk), _cell_type(dv))]
        args = (device(q), dk, dv, ids(seq_ids), ids(positions))
        kernel[blocks(n_tok * n_heads), ROW_THREADS](*args, np.int32(window), np.float32(scale), dout)
    write_back(out, dout)


def _elementwise(kernel, x, *args) -> None:  # type: ignore[no-untyped-def]
    """Launch an element-wise kernel whose first argument is updated in place."""
    dx = device(x)
    n = x.shape[0] * x.shape[1]
    if n:
        kernel[elem_blocks(n, ELEM_THREADS), ELEM_THREADS](dx, *args)
    write_back(x, dx)


def silu_mul(gate, up, out) -> None:  # type: ignore[no-untyped-def]
    """out = silu(gate) * up (SwiGLU), over 2-D arrays; out may be gate."""
    _activation(_silu_mul, gate, up, out)


def gelu_mul(gate, up, out) -> None:  # type: ignore[no-untyped-def]
    """out = gelu(gate) * up with the tanh approximation, over 2-D arrays; out may be gate."""
    _activation(_gelu_mul, gate, up, out)


def _activation(kernel, gate, up, out) -> None:  # type: ignore[no-untyped-def]
    dg = device(gate)
    dout = dg if out is gate else device(out)
    n = gate.shape[0] * gate.shape[1]
    if n:
        kernel[elem_blocks(n, ELEM_THREADS), ELEM_THREADS](dg, device(up), dout)
    write_back(out, dout)


def add_inplace(x, y) -> None:  # type: ignore[no-untyped-def]
    """x += y over 2-D arrays (the residual stream)."""
    _elementwise(_add_inplace, x, device(y))


def add_bias_inplace(x, bias) -> None:  # type: ignore[no-untyped-def]
    """x[r] += bias for every row r of a 2-D x (Qwen2's Q/K/V projection biases)."""
    _elementwise(_add_bias_inplace, x, device(bias))


def scale_inplace(x, factor: float) -> None:  # type: ignore[no-untyped-def]
    _elementwise(_scale_inplace, x, np.float32(factor))
