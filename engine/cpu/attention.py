"""Attention over the KV cache on the CPU, and the store that fills it.

The cells are f16 or q8_0, keys and values each their own type (engine/cpu/kv_cells.py reads and writes
them inside these kernels: nothing is dequantized ahead).

Work is split into jobs of (query tile, chunk of cells, kv head):
- a chunk is KEY_CHUNK cells of one sequence, so a single decoding sequence at a long context still
  keeps every thread busy (partial results are merged per token, flash-decoding style);
- a query tile is up to QUERY_TILE consecutive tokens of one sequence (a prefill), which share every
  key and value row read, as do the query heads of a kv head (grouped-query attention).
A token's result never depends on the batch it is in: chunks are anchored at its own first visible
cell, and cells are scored four at a time in groups anchored there too, whatever the tile.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from engine.cpu.kv_cells import add_row1, add_rows4, as_kernel_cells, dot1, dot4, store_row
from engine.cpu.lanes import ORDERED, exp_and_sum, scale_and_max
from engine.cpu.vecmath import exp

# ORDERED (engine/cpu/lanes.py): every sum here adds in one order, so each level returns the same bits.
_KERNEL = {"cache": True, "nogil": True, "fastmath": ORDERED, "error_model": "numpy"}
F0 = np.float32(0.0)
KEY_CHUNK = 256
QUERY_TILE = 8


def store_kv(
    k: np.ndarray,
    v: np.ndarray,
    seq_ids: np.ndarray,
    positions: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
) -> None:
    """Write k/v[T, n_kv_heads, head_dim] into the caches [n_seq, n_kv_heads, n_ctx, row] (f16 or q8_0)."""
    _store_kv(k, v, seq_ids, positions, as_kernel_cells(k_cache), as_kernel_cells(v_cache))


def attention(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    seq_ids: np.ndarray,
    positions: np.ndarray,
    window: int,
    scale: float,
    out: np.ndarray,
    limits: np.ndarray | None = None,
) -> None:
    """Causal attention of q[T, n_heads, head_dim] over the cached keys/values (f16 or q8_0) of each token.

    Token t attends to cache cells 0..positions[t] of its sequence (the batch's own k/v are already
    stored). With window > 0 only the last `window` positions are visible (sliding-window layers).
    Grouped-query: query head h reads kv head h // (n_heads / n_kv_heads).
    `limits` (int32 [T]): the last cell each token sees, where it is not its own position: the tokens of
    a media chunk decoded non-causally (Gemma 3's images) see the whole chunk; the window still counts
    back from the token's own position, as llama.cpp's mask does.
    """
    k_cells, v_cells = as_kernel_cells(k_cache), as_kernel_cells(v_cache)
    upto = positions if limits is None else limits
    _attention(q, k_cells, v_cells, seq_ids, upto, positions, window, scale, out)


@njit(**_KERNEL)
def _store_kv(
    k: np.ndarray,
    v: np.ndarray,
    seq_ids: np.ndarray,
    positions: np.ndarray,
    k_bits: np.ndarray,
    v_bits: np.ndarray,
) -> None:
    n_tok, n_kv, _ = k.shape
    for t in range(n_tok):
        for h in range(n_kv):
            store_row(k[t, h], k_bits, seq_ids[t], h, positions[t])
            store_row(v[t, h], v_bits, seq_ids[t], h, positions[t])


# A call with at most SERIAL_JOBS jobs and fewer multiply-adds than SERIAL_WORK (cells x query heads x
# head_dim, summed over its tokens) runs on the calling thread: a parallel region costs ~7 us, more
# than one sequence's whole decode attention at a short context.
SERIAL_JOBS = 8
SERIAL_WORK = 200_000


@njit(**_KERNEL)
def _attention(
    q: np.ndarray,
    k_bits: np.ndarray,
    v_bits: np.ndarray,
    seq_ids: np.ndarray,
    positions: np.ndarray,
    lows: np.ndarray,
    window: int,
    scale: float,
    out: np.ndarray,
) -> None:
    """`positions`: the last cell each token sees; `lows`: the position its window counts back from."""
    n_tok, n_heads, dim = q.shape
    n_kv = k_bits.shape[1]
    first = np.empty(n_tok, np.int64)  # token t sees cells first[t] .. positions[t]
    chunk_start = np.zeros(n_tok + 1, np.int64)  # token t's partial results: rows chunk_start[t] ..
    work = 0
    for t in range(n_tok):
        first[t] = max(0, lows[t] + 1 - window) if window > 0 else 0
        chunk_start[t + 1] = chunk_start[t] + _n_chunks(first[t], positions[t])
        work += (positions[t] + 1 - first[t]) * n_heads * dim
    tile_start = _query_tiles(seq_ids, positions, first)
    # jobs: for each tile, one per chunk of its last token (the longest) and kv head
    n_tiles = len(tile_start) - 1
    job_start = np.zeros(n_tiles + 1, np.int64)
    for i in range(n_tiles):
        last = tile_start[i + 1] - 1
        job_start[i + 1] = job_start[i] + _n_chunks(first[last], positions[last]) * n_kv
    part_max = np.empty((chunk_start[n_tok], n_heads), np.float32)
    part_sum = np.empty((chunk_start[n_tok], n_heads), np.float32)
    part_out = np.empty((chunk_start[n_tok], n_heads, dim), np.float32)
    parts = (part_max, part_sum, part_out)
    plan = (first, chunk_start, tile_start, job_start)
    # Tokens whose cells fit one chunk are finished by their job; the others' chunks are merged after.
    long_tokens = np.nonzero(chunk_start[1:] - chunk_start[:-1] > 1)[0]
    if work < SERIAL_WORK and job_start[n_tiles] <= SERIAL_JOBS:
        for job in range(job_start[n_tiles]):
            _run_job(job, plan, q, k_bits, v_bits, seq_ids, positions, scale, parts, out)
        for job in range(len(long_tokens) * n_heads):
            _merge_job(job, long_tokens, chunk_start, parts, out)
    else:
        _run_parallel(plan, long_tokens, q, k_bits, v_bits, seq_ids, positions, scale, parts, out)


@njit(parallel=True, **_KERNEL)
def _run_parallel(plan, long_tokens, q, k_bits, v_bits, seq_ids, positions, scale, parts, out) -> None:  # type: ignore[no-untyped-def]
    job_start = plan[3]
    # np.int64(job): a prange index is uint64 in the parallel body, int64 where Numba types the loop
    # first, and each type compiles its own copy of the callee (the serial path's int64 is the one kept)
    for job in prange(job_start[len(job_start) - 1]):
        _run_job(np.int64(job), plan, q, k_bits, v_bits, seq_ids, positions, scale, parts, out)
    for job in prange(len(long_tokens) * q.shape[1]):
        _merge_job(np.int64(job), long_tokens, plan[1], parts, out)


@njit(**_KERNEL)
def _run_job(job, plan, q, k_bits, v_bits, seq_ids, positions, scale, parts, out) -> None:  # type: ignore[no-untyped-def]
    """Job `job`: one chunk of one kv head for one query tile."""
    first, chunk_start, tile_start, job_start = plan
    part_max, part_sum, part_out = parts
    n_kv = k_bits.shape[1]
    group = q.shape[1] // n_kv
    i = np.searchsorted(job_start, job, side="right") - 1
    chunk = (job - job_start[i]) // n_kv
    kv_h = job - job_start[i] - chunk * n_kv
    t0, t1 = tile_start[i], tile_start[i + 1]
    h0 = kv_h * group
    _attend_chunk(
        np.ascontiguousarray(q[t0:t1, h0 : h0 + group]),  # contiguous: 2x faster dot products
        positions[t0:t1],
        k_bits[seq_ids[t0], kv_h],
        v_bits[seq_ids[t0], kv_h],
        first[t0] + chunk * KEY_CHUNK,
        scale,
        part_max[:, h0 : h0 + group],
        part_sum[:, h0 : h0 + group],
        part_out[:, h0 : h0 + group],
        chunk_start[t0:t1],
        chunk,
        chunk_start[t0 + 1 : t1 + 1],
        out[t0:t1, h0 : h0 + group],
    )


@njit(**_KERNEL)
def _merge_job(job, long_tokens, chunk_start, parts, out) -> None:  # type: ignore[no-untyped-def]
    """Merge job `job`: one query head of one token whose cells span several chunks."""
    n_heads = out.shape[1]
    t = long_tokens[job // n_heads]
    h = job % n_heads
    r0, r1 = chunk_start[t], chunk_start[t + 1]
    part_max, part_sum, part_out = parts
    _merge_chunks(part_max[r0:r1, h], part_sum[r0:r1, h], part_out[r0:r1, h], out[t, h])


@njit(inline="always", **_KERNEL)
def _n_chunks(first: int, position: int) -> int:
    return (position + 1 - first + KEY_CHUNK - 1) // KEY_CHUNK


@njit(**_KERNEL)
def _query_tiles(seq_ids: np.ndarray, positions: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Tile boundaries: runs of up to QUERY_TILE consecutive tokens of one sequence, last cells not
    falling (equal in a non-causal media chunk), that see the same first cell (so their chunks line up)."""
    n_tok = len(seq_ids)
    starts = np.empty(n_tok + 1, np.int64)
    n = 0
    for t in range(n_tok):
        s0 = starts[n - 1] if n else -1
        joins = (
            n > 0
            and t - s0 < QUERY_TILE
            and seq_ids[t] == seq_ids[t - 1]
            and positions[t] >= positions[t - 1]
            and first[t] == first[s0]
        )
        if not joins:
            starts[n] = t
            n += 1
    starts[n] = n_tok
    return starts[: n + 1]


@njit(**_KERNEL)
def _attend_chunk(
    q: np.ndarray,
    positions: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    lo: int,
    scale: float,
    part_max: np.ndarray,
    part_sum: np.ndarray,
    part_out: np.ndarray,
    first_rows: np.ndarray,
    chunk: int,
    row_ends: np.ndarray,
    out: np.ndarray,
) -> None:
    """Chunk `chunk` (cells lo .. lo + KEY_CHUNK) for the tile's tokens q[tt], each up to its own
    position, and query heads q[tt, g]. A token whose cells all fit this one chunk gets its final
    output in out[tt]; otherwise the chunk's per-head max score, sum of exp(score - max) and
    unnormalised output go to partial-result row first_rows[tt] + chunk (if the token has that row).

    Cells go four at a time, each four read once for the whole tile: one pass over the head dimension
    serves four dot products (or four value rows), which keeps the work in vector registers. A group
    of four may reach past a token's position (those cells get weight 0), never past the cache.
    """
    n_q, group, dim = q.shape
    n = min(KEY_CHUNK, positions[n_q - 1] + 1 - lo)
    n_cells = keys.shape[0]
    # cells j < grouped go in groups of four: every group that starts below n and fits in the cache
    grouped = 4 * min((n + 3) // 4, (n_cells - lo) // 4)
    scores = np.empty((n_q, group, grouped + 4), np.float32)
    for j in range(0, grouped, 4):
        for tt in range(n_q):
            for g in range(group):
                s = scores[tt, g]
                s[j], s[j + 1], s[j + 2], s[j + 3] = dot4(q[tt, g], keys, lo + j)
    for j in range(grouped, n):
        for tt in range(n_q):
            for g in range(group):
                scores[tt, g, j] = dot1(q[tt, g], keys, lo + j)
    sc = np.float32(scale)
    m_out = np.empty((n_q, group), np.float32)
    s_out = np.empty((n_q, group), np.float32)
    for tt in range(n_q):
        n_t = max(0, min(n, positions[tt] + 1 - lo))
        for g in range(group):
            s = scores[tt, g]
            best = scale_and_max(s, sc, n_t)
            total = exp_and_sum(s, best, n_t)
            s[n_t : max(grouped, n)] = F0
            m_out[tt, g] = best
            s_out[tt, g] = total
    o_out = np.zeros((n_q, group, dim), np.float32)
    for j in range(0, grouped, 4):
        for tt in range(n_q):
            for g in range(group):
                add_rows4(o_out[tt, g], scores[tt, g, j : j + 4], values, lo + j)
    for j in range(grouped, n):
        for tt in range(n_q):
            for g in range(group):
                add_row1(o_out[tt, g], scores[tt, g, j], values, lo + j)
    for tt in range(n_q):
        row = first_rows[tt] + chunk
        if chunk == 0 and row_ends[tt] - first_rows[tt] == 1:  # its only chunk: the final output
            for g in range(group):
                inv = np.float32(1.0) / s_out[tt, g]
                for i in range(dim):
                    out[tt, g, i] = o_out[tt, g, i] * inv
        elif row < row_ends[tt]:
            part_max[row] = m_out[tt]
            part_sum[row] = s_out[tt]
            part_out[row] = o_out[tt]


@njit(**_KERNEL)
def _merge_chunks(part_max: np.ndarray, part_sum: np.ndarray, part_out: np.ndarray, out: np.ndarray) -> None:
    """out = the normalised attention output from its chunks' (max, sum, unnormalised output)."""
    best = part_max.max()
    total = F0
    out[:] = F0
    for c in range(part_max.shape[0]):
        w = exp(part_max[c] - best)
        total += part_sum[c] * w
        for i in range(out.shape[0]):
            out[i] += part_out[c, i] * w
    inv = np.float32(1.0) / total
    for i in range(out.shape[0]):
        out[i] *= inv
