"""Sampling on the device: softmax, greedy (argmax) and top-k over rows of logits.

Only the chosen tokens come back to the host: argmax returns one id per row; top_k returns the k best
(id, logit) pairs per row, best first, plus each row's log-sum-exp, so the host sampler finishes its
chain (temperature, top-p, min-p, the draw) on k candidates and logprobs are logit - lse.
Ties resolve to the lower token id, as numpy's stable sort and argmax do.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda, float32, int32

from engine.cuda.arrays import blocks, device, download, write_back
from engine.cuda.ops import MAX_THREADS, block_max, block_sum

THREADS = 256  # threads per row (a power of two, at most MAX_THREADS)
MAX_TOP_K = 64  # candidates each thread keeps; larger k is done on the host


@cuda.jit(device=True)
def _better(v, i, best_v, best_i):  # type: ignore[no-untyped-def]
    """Whether (v, i) ranks before (best_v, best_i): larger logit, then lower id."""
    return v > best_v or (v == best_v and i < best_i)


@cuda.jit(device=True)
def _block_argbest(vals, idx, tid, n):  # type: ignore[no-untyped-def]
    """Reduce (value, id) pairs in shared memory to the best one; every thread gets it."""
    stride = n // 2
    while stride > 0:
        cuda.syncthreads()
        if tid < stride and _better(vals[tid + stride], idx[tid + stride], vals[tid], idx[tid]):
            vals[tid] = vals[tid + stride]
            idx[tid] = idx[tid + stride]
        stride //= 2
    cuda.syncthreads()
    best_v = vals[0]
    best_i = idx[0]
    cuda.syncthreads()
    return best_v, best_i


def _row_stats(x, r, sm, tid, n):  # type: ignore[no-untyped-def]
    """(max, sum of exp(x - max)) of row r."""
    best = float32(-math.inf)
    for i in range(tid, x.shape[1], n):
        best = max(best, x[r, i])
    sm[tid] = best
    best = block_max(sm, tid, n)
    total = float32(0.0)
    for i in range(tid, x.shape[1], n):
        total += math.exp(x[r, i] - best)
    sm[tid] = total
    return best, block_sum(sm, tid, n)


_row_stats_dev = cuda.jit(device=True)(_row_stats)


def _softmax_py(x, out):  # type: ignore[no-untyped-def]
    sm = cuda.shared.array(MAX_THREADS, float32)
    tid = cuda.threadIdx.x
    n = cuda.blockDim.x
    for r in range(cuda.blockIdx.x, x.shape[0], cuda.gridDim.x):
        best, total = _row_stats_dev(x, r, sm, tid, n)
        inv = float32(1.0) / total
        for i in range(tid, x.shape[1], n):
            out[r, i] = math.exp(x[r, i] - best) * inv


def _argmax_py(x, out):  # type: ignore[no-untyped-def]
    vals = cuda.shared.array(MAX_THREADS, float32)
    idx = cuda.shared.array(MAX_THREADS, int32)
    tid = cuda.threadIdx.x
    n = cuda.blockDim.x
    for r in range(cuda.blockIdx.x, x.shape[0], cuda.gridDim.x):
        best_v = float32(-math.inf)
        best_i = int32(x.shape[1])
        for i in range(tid, x.shape[1], n):
            if _better(x[r, i], i, best_v, best_i):
                best_v = x[r, i]
                best_i = i
        vals[tid] = best_v
        idx[tid] = best_i
        _, best_i = _block_argbest(vals, idx, tid, n)
        if tid == 0:
            out[r] = best_i


def _top_k_py(x, k, out_ids, out_vals, out_lse):  # type: ignore[no-untyped-def]
    """Each thread keeps its own best k (sorted) over its strided share of the row; then k rounds of a
    block-wide pick among the threads' current heads, the winner advancing to its next candidate."""
    vals = cuda.shared.array(MAX_THREADS, float32)
    idx = cuda.shared.array(MAX_THREADS, int32)
    mine_v = cuda.local.array(MAX_TOP_K, float32)
    mine_i = cuda.local.array(MAX_TOP_K, int32)
    for r in range(cuda.blockIdx.x, x.shape[0], cuda.gridDim.x):
        count = _keep_best(x, r, k, mine_v, mine_i)
        _merge_best(x.shape[1], r, k, count, mine_v, mine_i, vals, idx, out_ids, out_vals)
        best, total = _row_stats_dev(x, r, vals, cuda.threadIdx.x, cuda.blockDim.x)
        if cuda.threadIdx.x == 0:
            out_lse[r] = best + math.log(total)


@cuda.jit(device=True)
def _keep_best(x, r, k, mine_v, mine_i):  # type: ignore[no-untyped-def]
    """This thread's best k of its share of row r, sorted; returns how many it holds."""
    count = 0
    for i in range(cuda.threadIdx.x, x.shape[1], cuda.blockDim.x):
        v = x[r, i]
        if count == k and not v > mine_v[k - 1]:
            continue
        pos = count if count < k else k - 1  # insert after every kept value >= v (lower ids first)
        while pos > 0 and v > mine_v[pos - 1]:
            mine_v[pos] = mine_v[pos - 1]
            mine_i[pos] = mine_i[pos - 1]
            pos -= 1
        mine_v[pos] = v
        mine_i[pos] = i
        if count < k:
            count += 1
    return count


@cuda.jit(device=True)
def _merge_best(n_vocab, r, k, count, mine_v, mine_i, vals, idx, out_ids, out_vals):  # type: ignore[no-untyped-def]
    """k rounds: the best of the threads' current heads is the next pick; its thread moves on."""
    tid = cuda.threadIdx.x
    head = 0
    for c in range(k):
        vals[tid] = mine_v[head] if head < count else float32(-math.inf)
        idx[tid] = mine_i[head] if head < count else int32(n_vocab)
        best_v, best_i = _block_argbest(vals, idx, tid, cuda.blockDim.x)
        if head < count and mine_i[head] == best_i:
            head += 1
        if tid == 0:
            out_ids[r, c] = best_i
            out_vals[r, c] = best_v


_softmax = cuda.jit(_softmax_py)
_argmax = cuda.jit(_argmax_py)
_top_k = cuda.jit(_top_k_py)


def softmax(x: Any, out: Any) -> None:
    """out[r] = softmax(x[r]) over 2-D float32 rows."""
    dout = device(out)
    if x.shape[0]:
        _softmax[blocks(x.shape[0]), THREADS](device(x), dout)
    write_back(out, dout)


def argmax(x: Any) -> np.ndarray:
    """Greedy picks: int32 [rows], the first maximum of each row (only these come back)."""
    out = cuda.device_array(x.shape[0], dtype=np.int32)
    if x.shape[0]:
        _argmax[blocks(x.shape[0]), THREADS](device(x), out)
    return download(out)


def top_k(x: Any, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids int32 [rows, k], logits float32 [rows, k], log-sum-exp float32 [rows]), best first."""
    rows, n_vocab = x.shape
    if not 1 <= k <= min(MAX_TOP_K, n_vocab):
        raise ValueError(f"top_k: k must be in 1..{min(MAX_TOP_K, n_vocab)}, got {k}")
    out_ids = cuda.device_array((rows, k), dtype=np.int32)
    out_vals = cuda.device_array((rows, k), dtype=np.float32)
    out_lse = cuda.device_array(rows, dtype=np.float32)
    if rows:
        _top_k[blocks(rows), THREADS](device(x), np.int32(k), out_ids, out_vals, out_lse)
    return download(out_ids), download(out_vals), download(out_lse)
