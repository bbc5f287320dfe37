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
from numba import njit, prange

from engine.cpu.lanes import ORDERED, exp_and_sum
from engine.cpu.matmul.floats import (
    FLOAT_PANELS,
    PANEL_ROWS,
    add_narrow1,
    add_narrow2,
    add_narrow4,
    add_narrow6,
    add_sums1,
    add_sums2,
    add_sums4,
    add_sums6,
)

_KERNEL = {"cache": True, "nogil": True, "fastmath": ORDERED, "error_model": "numpy"}
F0 = np.float32(0.0)
F1 = np.float32(1.0)
MASKED = np.float32(-1e30)  # a masked score: finite, and exp(MASKED - max) underflows to 0
QUERY_TILE = 24  # a multiple of 6: the panels' widest (engine/cpu/matmul/floats.py)
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
    vh = np.empty((v.shape[1], v.shape[0], v.shape[2]), np.float32)  # vh[h, t] = v[t, h]
    args = (q, kt, vh, spans, positions, causal, window, slopes, np.float32(scale), tiles, out)
    if work < SERIAL_WORK:
        _by_head(k, v, kt, vh)
        _run_serial(*args)
    else:
        _by_head_parallel(k, v, kt, vh)
        _run_parallel(*args)


# The keys and values are laid out by head once per call, the keys transposed ([dim, tokens] a head): a
# job transposing its input's keys for itself repeated it for every query tile (128 tiles of a 4096-token
# SigLIP image). The values' rows of one head were 16 x 72 floats apart in a SigLIP layer's [tokens,
# heads, dim]: a stride of 4608 bytes fills only 8 of L1's 64 sets, so a 16-column panel of 512 value
# rows came from L2 (weighted values 19.9 -> 22.3 GMAC/s with the rows contiguous, one thread, 2026-12-08).
@njit(**_KERNEL)
def _by_head(k: np.ndarray, v: np.ndarray, kt: np.ndarray, vh: np.ndarray) -> None:
    for h in range(k.shape[1]):
        _head(k, v, kt, vh, h)


@njit(parallel=True, **_KERNEL)
def _by_head_parallel(k: np.ndarray, v: np.ndarray, kt: np.ndarray, vh: np.ndarray) -> None:
    for h in prange(k.shape[1]):
        _head(k, v, kt, vh, h)


@njit(inline="always", **_KERNEL)
def _head(k: np.ndarray, v: np.ndarray, kt: np.ndarray, vh: np.ndarray, h: int) -> None:
    for t in range(k.shape[0]):
        for i in range(k.shape[2]):
            kt[h, i, t] = k[t, h, i]
        vh[h, t] = v[t, h]


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
def _run_serial(q, kt, vh, spans, positions, causal, window, slopes, scale, tiles, out) -> None:  # type: ignore[no-untyped-def]
    n_heads = q.shape[1]
    for job in range((len(tiles) - 1) * n_heads):
        _run_job(job, q, kt, vh, spans, positions, causal, window, slopes, scale, tiles, out)


@njit(parallel=True, **_KERNEL)
def _run_parallel(q, kt, vh, spans, positions, causal, window, slopes, scale, tiles, out) -> None:  # type: ignore[no-untyped-def]
    n_heads = q.shape[1]
    for job in prange((len(tiles) - 1) * n_heads):
        _run_job(job, q, kt, vh, spans, positions, causal, window, slopes, scale, tiles, out)


# Scores as a tile of queries against every key of the input at once: keys transposed (kt[i, j], key j's
# dimension i), each score the sum over i in order of q[i] * kt[i, j], LLVM's vectors running
# across keys. The earlier form, one 16-lane dot product (and its lane fold) per query and key, spent
# 54% of a MiniLM pass here (4 inputs of 132 tokens, head_dim 32: 65 ms of 120, 2 threads, 2026-12-06).
# The whole tile goes through each key row and each value row together (KEY_CHUNK keys at a time for
# the scores, whose tile stays in L1): one query at a time re-read every key and value of the input per
# query, which made a SigLIP layer's attention (4096 tokens, 16 heads of 72) take 14 s of 18 (2 threads).
@njit(**_KERNEL)
def _run_job(job, q, kt, vh, spans, positions, causal, window, slopes, scale, tiles, out) -> None:  # type: ignore[no-untyped-def]
    """One head of one query tile: scores over the tile's input, softmax, the weighted value rows."""
    n_heads, n_tiles = q.shape[1], len(tiles) - 1
    # head-major: a thread's consecutive jobs share a head's keys and values (in cache, not re-read)
    h, tile = job // n_tiles, job % n_tiles
    kv_h = h // (n_heads // kt.shape[0])
    t0, t1 = tiles[tile], tiles[tile + 1]
    lo, hi = spans[t0, 0], spans[t0, 1]
    n = hi - lo
    if FLOAT_PANELS:  # scores in whole panels of keys (kt has PANEL_ROWS zero keys past the last)
        probs = np.zeros((t1 - t0, -(-n // PANEL_ROWS) * PANEL_ROWS), np.float32)
        _add_products(q[t0:t1, h], kt[kv_h, :, lo:], probs)
    else:
        probs = np.empty((t1 - t0, n), np.float32)
        _tile_scores(q[t0:t1, h], kt[kv_h], lo, probs)  # the head's whole matrix: rows of unit stride
    for tt in range(t1 - t0):
        _softmax(probs[tt, :n], positions, t0 + tt, lo, causal, window, slopes[h], scale)
    if FLOAT_PANELS and vh.shape[2] % 8 == 0:
        _panel_weighted_rows(probs[:, :n], vh[kv_h, lo:hi], out[t0:t1, h])
    else:
        _tile_weighted_rows(probs[:, :n], vh[kv_h, lo:hi], out[t0:t1, h])


# On the 256-bit FMA levels both products are panels (engine/cpu/matmul/floats.py's add_sums: up to 6
# queries x 16 keys or value dimensions in registers, one fma per product in the same order as the tiles
# below, so the same bits), summed straight into the scores and the output. One SigLIP layer (4096 tokens,
# 16 heads of 72, 2 threads, 2026-12-08, EPYC znver3): 2.0-2.35 s with the panels stored through a scratch
# panel, every value row of the input in one pass and tiles of 32 queries (a panel of 2 in each); 1.5 s
# with VALUE_CHUNK value rows at a time (they stay in L1 across the tile's panels) and tiles of 24 (4
# panels of 6); 0.96 s with the softmax's unmasked loop vectorized (_softmax).
VALUE_CHUNK = 128


@njit(**_KERNEL)
def _panel_weighted_rows(probs: np.ndarray, v: np.ndarray, out: np.ndarray) -> None:
    """out[tt] = the sum over j, in order, of probs[tt, j] * v[j]: VALUE_CHUNK rows at a time, each output's
    fma chain continued from chunk to chunk."""
    acc = np.zeros(out.shape, np.float32)
    n = probs.shape[1]
    for j0 in range(0, n, VALUE_CHUNK):
        j1 = min(n, j0 + VALUE_CHUNK)
        _add_products(probs[:, j0:j1], v[j0:j1], acc)
    out[:, :] = acc


@njit(**_KERNEL)
def _add_products(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """out[t, c] += the products x[t, k] * w[k, c] for every k in order, one fma each (from zeros: the sum
    in order). Columns in panels of PANEL_ROWS and a last one of 8 where fewer are left: w's columns
    readable and out's writable to the end of each panel."""
    n_tok, n_out = out.shape
    for col in range(0, n_out, PANEL_ROWS):
        wide = n_out - col > 8
        t = 0
        while t < n_tok:
            left = n_tok - t
            n = 6 if left >= 6 else 4 if left >= 4 else 2 if left >= 2 else 1
            if wide:
                if n == 6:
                    add_sums6(out, w, x, t, col)
                elif n == 4:
                    add_sums4(out, w, x, t, col)
                elif n == 2:
                    add_sums2(out, w, x, t, col)
                else:
                    add_sums1(out, w, x, t, col)
            elif n == 6:
                add_narrow6(out, w, x, t, col)
            elif n == 4:
                add_narrow4(out, w, x, t, col)
            elif n == 2:
                add_narrow2(out, w, x, t, col)
            else:
                add_narrow1(out, w, x, t, col)
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
    if causal or window > 0 or slope != F0:
        for j in range(n):
            pj = positions[lo + j]
            if not _visible(p, pj, causal, window):
                s[j] = MASKED
            elif slope != F0:
                s[j] = s[j] * scale + slope * np.float32(-abs(pj - p))
            else:
                s[j] = s[j] * scale
            best = max(best, s[j])  # a max is exact in any order
    else:  # every key visible, no bias: a loop LLVM vectorizes (a SigLIP layer 1.51 -> 0.96 s)
        for j in range(n):
            s[j] = s[j] * scale
            best = max(best, s[j])
    inv = F1 / exp_and_sum(s, best, n)
    for j in range(n):
        s[j] *= inv


@njit(inline="always", **_KERNEL)
def _tile_weighted_rows(probs: np.ndarray, v: np.ndarray, out: np.ndarray) -> None:
    """out[tt] = the sum over j, in order, of probs[tt, j] * v[j]."""
    n_q, n = probs.shape
    dim = out.shape[1]
    acc = np.zeros((n_q, dim), np.float32)
    for j in range(n):
        row = v[j]
        for tt in range(n_q):
            w = probs[tt, j]
            at = acc[tt]
            for i in range(dim):
                at[i] += w * row[i]
    for tt in range(n_q):
        for i in range(dim):
            out[tt, i] = acc[tt, i]
