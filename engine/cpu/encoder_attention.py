"""Attention of an encoder on the CPU: every token over its own input's tokens in the batch.

An encoder (BERT and kin) keeps no KV cache: its inputs come whole in one forward pass, and the keys and
values are the batch's own float32 rows (llama.cpp's no-cache attention, without flash attention: f32
scores, softmax, then the probabilities times V). Token t sees the rows starts[t] .. ends[t] - 1 (its
input's span in the batch; several inputs may share a pass), all of them unless the layer is causal
(then those at positions up to its own) or has a symmetric sliding window (ModernBERT, EmbeddingGemma:
|p_t - p_j| <= window // 2). ALiBi (jina-bert-v2) adds slope[h] * -|p_t - p_j| to each scaled score.

A token's output depends only on its own input's rows, taken in their order, with every sum in a fixed
lane order (engine/cpu/lanes.py): the same bits whatever else shares the pass, on every x86 level.
Jobs are (query tile, head): up to QUERY_TILE consecutive tokens of one input over its keys, transposed once.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit, prange

from engine.cpu.lanes import ORDERED, exp_and_sum
from engine.cpu.matmul.floats import (
    FLOAT_PANELS,
    PANEL_ROWS,
    narrow_sums1,
    narrow_sums2,
    narrow_sums4,
    narrow_sums6,
    panel_sums1,
    panel_sums2,
    panel_sums4,
    panel_sums6,
    store_panel,
)
from engine.cpu.matmul.tiles import _alloca_f32

_KERNEL = {"cache": True, "nogil": True, "fastmath": ORDERED, "error_model": "numpy"}
F0 = np.float32(0.0)
F1 = np.float32(1.0)
MASKED = np.float32(-1e30)  # a masked score: finite, and exp(MASKED - max) underflows to 0
QUERY_TILE = 32
SERIAL_WORK = 200_000  # below this many multiply-adds a call runs on the calling thread


def encoder_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    spans: np.ndarray,
    positions: np.ndarray,
    causal: bool,
    window: int,
    slopes: np.ndarray,
    scale: float,
    out: np.ndarray,
) -> None:
    """out[T, n_heads, dim] = attention of q[T, n_heads, dim] over k, v [T, n_kv_heads, dim] (float32);
    spans[T, 2]: each token's input as [start, end) rows of the batch; slopes[n_heads]: ALiBi's (zeros
    without). Query head h reads kv head h // (n_heads / n_kv_heads)."""
    tiles = _query_tiles(spans)
    work = int(np.sum((spans[:, 1] - spans[:, 0]).astype(np.int64))) * q.shape[1] * q.shape[2]
    # kt[h, i, t] = k[t, h, i]; PANEL_ROWS columns past the last key, zeros, so a panel may read past an input
    kt = np.empty((k.shape[1], k.shape[2], k.shape[0] + PANEL_ROWS), np.float32)
    kt[:, :, k.shape[0] :] = 0.0
    args = (q, kt, v, spans, positions, causal, window, slopes, np.float32(scale), tiles, out)
    if work < SERIAL_WORK:
        _transpose_keys(k, kt)
        _run_serial(*args)
    else:
        _transpose_keys_parallel(k, kt)
        _run_parallel(*args)


# The keys are transposed once per call, each kv head its own [dim, tokens] matrix: a job transposing its
# input's keys for itself repeated it for every query tile (128 tiles of a 4096-token SigLIP image).
@njit(**_KERNEL)
def _transpose_keys(k: np.ndarray, kt: np.ndarray) -> None:
    for h in range(k.shape[1]):
        _transpose_head(k, kt, h)


@njit(parallel=True, **_KERNEL)
def _transpose_keys_parallel(k: np.ndarray, kt: np.ndarray) -> None:
    for h in prange(k.shape[1]):
        _transpose_head(k, kt, h)


@njit(inline="always", **_KERNEL)
def _transpose_head(k: np.ndarray, kt: np.ndarray, h: int) -> None:
    for t in range(k.shape[0]):
        for i in range(k.shape[2]):
            kt[h, i, t] = k[t, h, i]


@njit(**_KERNEL)
def _query_tiles(spans: np.ndarray) -> np.ndarray:
    """Tile boundaries: runs of up to QUERY_TILE consecutive tokens of one input."""
    n_tok = spans.shape[0]
    starts = np.empty(n_tok + 1, np.int64)
    n = 0
    for t in range(n_tok):
        if n == 0 or t - starts[n - 1] >= QUERY_TILE or spans[t, 0] != spans[t - 1, 0]:
            starts[n] = t
            n += 1
    starts[n] = n_tok
    return starts[: n + 1]


@njit(**_KERNEL)
def _run_serial(q, kt, v, spans, positions, causal, window, slopes, scale, tiles, out) -> None:  # type: ignore[no-untyped-def]
    n_heads = q.shape[1]
    for job in range((len(tiles) - 1) * n_heads):
        _run_job(job, q, kt, v, spans, positions, causal, window, slopes, scale, tiles, out)


@njit(parallel=True, **_KERNEL)
def _run_parallel(q, kt, v, spans, positions, causal, window, slopes, scale, tiles, out) -> None:  # type: ignore[no-untyped-def]
    n_heads = q.shape[1]
    for job in prange((len(tiles) - 1) * n_heads):
        _run_job(job, q, kt, v, spans, positions, causal, window, slopes, scale, tiles, out)


# Scores as a tile of queries against every key of the input at once: keys transposed (kt[i, j], key j's
# dimension i), each score the sum over i in order of q[i] * kt[i, j], LLVM's vectors running
# across keys. The earlier form, one 16-lane dot product (and its lane fold) per query and key, spent
# 54% of a MiniLM pass here (4 inputs of 132 tokens, head_dim 32: 65 ms of 120, 2 threads, 2026-12-06).
# The whole tile goes through each key row and each value row together (KEY_CHUNK keys at a time for
# the scores, whose tile stays in L1): one query at a time re-read every key and value of the input per
# query, which made a SigLIP layer's attention (4096 tokens, 16 heads of 72) take 14 s of 18 (2 threads).
@njit(**_KERNEL)
def _run_job(job, q, kt, v, spans, positions, causal, window, slopes, scale, tiles, out) -> None:  # type: ignore[no-untyped-def]
    """One head of one query tile: scores over the tile's input, softmax, the weighted value rows."""
    n_heads, n_tiles = q.shape[1], len(tiles) - 1
    # head-major: a thread's consecutive jobs share a head's keys and values (in cache, not re-read)
    h, tile = job // n_tiles, job % n_tiles
    kv_h = h // (n_heads // kt.shape[0])
    t0, t1 = tiles[tile], tiles[tile + 1]
    lo, hi = spans[t0, 0], spans[t0, 1]
    probs = np.empty((t1 - t0, hi - lo), np.float32)
    if FLOAT_PANELS:
        _panel_products(q[t0:t1, h], kt[kv_h, :, lo:], probs)
    else:
        _tile_scores(q[t0:t1, h], kt[kv_h], lo, probs)  # the head's whole matrix: rows of unit stride
    for tt in range(t1 - t0):
        _softmax(probs[tt], positions, t0 + tt, lo, causal, window, slopes[h], scale)
    if FLOAT_PANELS and v.shape[2] % 8 == 0:
        _panel_products(probs, v[lo:hi, kv_h], out[t0:t1, h])
    else:
        _tile_weighted_rows(probs, v, lo, kv_h, out[t0:t1, h])


# On the 256-bit FMA levels both products are panels (engine/cpu/matmul/floats.py's panel_sums: up to 6
# queries x 16 keys or value dimensions in registers, one fma per product in the same order as the
# tiles below, so the same bits). The tiles keep their sums in a local array, a load and a store per
# vector of products: MiniLM's attention, 4 inputs of 128 tokens, 2 threads (2026-12-07, EPYC znver3):
# MEASURE.
@njit(**_KERNEL)
def _panel_products(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """out[t, c] = the sum over k, in order, of x[t, k] * w[k, c] (c < out.shape[1]; w readable to the
    next multiple of PANEL_ROWS columns, or of 8 where the last panel is 8 wide or less)."""
    panel = carray(_alloca_f32(256), (8, 32))
    n_tok, n_out = out.shape
    for col in range(0, n_out, PANEL_ROWS):
        width = min(PANEL_ROWS, n_out - col)
        t = 0
        while t < n_tok:
            left = n_tok - t
            n = 6 if left >= 6 else 4 if left >= 4 else 2 if left >= 2 else 1
            if width > 8:
                if n == 6:
                    panel_sums6(panel, w, x, t, col)
                elif n == 4:
                    panel_sums4(panel, w, x, t, col)
                elif n == 2:
                    panel_sums2(panel, w, x, t, col)
                else:
                    panel_sums1(panel, w, x, t, col)
            elif n == 6:
                narrow_sums6(panel, w, x, t, col)
            elif n == 4:
                narrow_sums4(panel, w, x, t, col)
            elif n == 2:
                narrow_sums2(panel, w, x, t, col)
            else:
                narrow_sums1(panel, w, x, t, col)
            store_panel(panel, out, col, t, n, PANEL_ROWS)
            t += n


KEY_CHUNK = 128  # keys whose scores the tile accumulates together (32 x 128 floats: 16 KB)


@njit(**_KERNEL)
def _tile_scores(qs: np.ndarray, kt: np.ndarray, lo: int, s: np.ndarray) -> None:
    """s[tt, j] = the sum over i, in order, of qs[tt, i] * kt[i, lo + j]: each score one chain, whatever
    its lane or its tile. The sums run in a fresh local tile, copied out after: summed in place in `s`, the
    loop was not vectorized (LLVM could not rule out that `s` overlaps the keys): 2.8 GFLOP/s against
    33 (32 queries x 4096 keys x 72, one thread, 2026-12-06)."""
    n_q, n = s.shape
    acc = np.empty((n_q, KEY_CHUNK), np.float32)
    for j0 in range(0, n, KEY_CHUNK):
        m = min(n, j0 + KEY_CHUNK) - j0
        acc[:, :] = F0
        for i in range(kt.shape[0]):
            row = kt[i, lo + j0 : lo + j0 + m]
            for tt in range(n_q):
                qi = qs[tt, i]
                a = acc[tt]
                for j in range(m):
                    a[j] += qi * row[j]
        for tt in range(n_q):
            for j in range(m):
                s[tt, j0 + j] = acc[tt, j]


@njit(inline="always", **_KERNEL)
def _visible(p: int, pj: int, causal: bool, window: int) -> bool:
    if causal and pj > p:
        return False
    return window <= 0 or abs(pj - p) <= window // 2


@njit(**_KERNEL)
def _softmax(s, positions, t, lo, causal, window, slope, scale) -> None:  # type: ignore[no-untyped-def]
    """s[j] (raw scores of token t over rows lo + j) -> probabilities: scale * s + slope * -|p_t - p_j|
    (ggml's soft_max_ext with ALiBi's mask), masked rows MASKED (exp is 0 there: no infinities under
    fastmath), normalised."""
    n = s.shape[0]
    p = positions[t]
    best = MASKED
    for j in range(n):
        pj = positions[lo + j]
        if not _visible(p, pj, causal, window):
            s[j] = MASKED
        elif slope != F0:
            s[j] = s[j] * scale + slope * np.float32(-abs(pj - p))
        else:
            s[j] = s[j] * scale
        best = max(best, s[j])  # a max is exact in any order
    inv = F1 / exp_and_sum(s, best, n)
    for j in range(n):
        s[j] *= inv


@njit(inline="always", **_KERNEL)
def _tile_weighted_rows(probs: np.ndarray, v: np.ndarray, lo: int, kv_h: int, out: np.ndarray) -> None:
    """out[tt] = the sum over j, in order, of probs[tt, j] * v[lo + j, kv_h]."""
    n_q, n = probs.shape
    dim = out.shape[1]
    acc = np.zeros((n_q, dim), np.float32)
    for j in range(n):
        row = v[lo + j, kv_h]
        for tt in range(n_q):
            w = probs[tt, j]
            at = acc[tt]
            for i in range(dim):
                at[i] += w * row[i]
    for tt in range(n_q):
        for i in range(dim):
            out[tt, i] = acc[tt, i]
