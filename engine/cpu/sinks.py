"""Attention sinks (gpt-oss) on the CPU: each head's learned logit in the softmax's denominator.

With a sink s_h, llama.cpp's softmax over a token's scores x_j is exp(x_j) / (sum_j exp(x_j) + exp(s_h)):
the weights of the real cells sum to less than one. That is the ordinary attention output scaled by
S / (S + exp(s_h)), S = sum_j exp(x_j). The attention kernel (engine/cpu/attention.py) runs as it is;
`apply_sinks` then computes each (token, head)'s log-sum-exp of scores over the same cells (the window
included) and scales that head's output row: one more pass over the keys, none over the values, and no
change to the kernel every other model runs. Each token's factor depends on its own cells only, in a
fixed order, so it is bitwise the same in any batch.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from engine.cpu.kv_cells import as_kernel_cells, dot1
from engine.cpu.lanes import ORDERED, exp_and_sum, scale_and_max

# ORDERED (engine/cpu/lanes.py): the same bits on every level.
_KERNEL = {"cache": True, "nogil": True, "fastmath": ORDERED, "error_model": "numpy"}


def apply_sinks(
    q: np.ndarray,
    k_cache: np.ndarray,
    seq_ids: np.ndarray,
    positions: np.ndarray,
    window: int,
    scale: float,
    sinks: np.ndarray,
    out: np.ndarray,
) -> None:
    """Scale out[T, n_heads, head_dim] (attention's output for q over k_cache, as `attention` was called)
    by S / (S + exp(sink[h])) per token and head: the sinks' share of the softmax taken out."""
    _apply_sinks(q, as_kernel_cells(k_cache), seq_ids, positions, window, scale, sinks, out)


@njit(parallel=True, **_KERNEL)
def _apply_sinks(q, k_bits, seq_ids, positions, window, scale, sinks, out) -> None:  # type: ignore[no-untyped-def]
    n_tok, n_heads, _ = q.shape
    n_kv = k_bits.shape[1]
    group = n_heads // n_kv
    sc = np.float32(scale)
    for job in prange(n_tok * n_kv):
        t, kv_h = job // n_kv, job % n_kv
        first = max(0, positions[t] + 1 - window) if window > 0 else 0
        n = positions[t] + 1 - first
        keys = k_bits[seq_ids[t], kv_h]
        scores = np.empty(n, np.float32)
        for g in range(group):
            h = kv_h * group + g
            for j in range(n):
                scores[j] = dot1(q[t, h], keys, first + j)
            best = scale_and_max(scores, sc, n)
            total = exp_and_sum(scores, best, n)
            top = max(best, sinks[h])  # as llama.cpp's softmax: the max over scores and sink
            kept = total * np.float32(math.exp(best - top))
            factor = kept / (kept + np.float32(math.exp(sinks[h] - top)))
            for i in range(out.shape[2]):
                out[t, h, i] *= factor
