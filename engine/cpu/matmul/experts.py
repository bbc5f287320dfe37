"""Every chosen expert of a layer in one call: the matmul kernels' tiles over a 3-D expert tensor.

`experts_matmul(x, w, rows, runs, out)`: w packs n_expert matrices of `rows` rows each (expert e is row
groups e * rows / 32 ..., engine/cpu/experts.py); x holds the batch's (token, expert) rows sorted by
expert and runs[i] = (expert, start, end) says which of them expert i takes; out[start:end] = x[start:end]
@ W_expert.T. One parallel region per call: the work items are (run, row group of the expert), handed to
the threads in chunks from a counter (engine/cpu/chunks.py) as the large dense matmuls are, each item
running the format's own tile over the run's rows (the `_to` tiles write row group `go` of out while
reading row group g of w). The activations are quantized once per call, row by row, so every row's
output is bitwise what the per-expert matmul gives it, whatever else the batch holds.

Why: the per-expert loop made six Python calls per chosen expert and layer (take_rows, the gate|up
matmul, its split, SwiGLU, the down matmul), ~2,300 a token on Qwen3-30B-A3B's 48 layers of top-8, each
matmul a parallel region started and joined. Measured in one process on scripts/make_moe_bench_model.py's
16-layer model (/tmp A/B script: this kernel and the matmul-per-expert fallback alternated, 6 rounds
of 4 decode steps and a 64-token prompt, every expert packed first; 2026-12-05 13:39, load 13-15 from
other work on the 2 cores): decode step 1605 ms (loop) -> 893 ms (one call) median, 0.55x;
64-token prompt 18.2 -> 4.4 s, 0.25x (the loop ran ~120 experts of a few rows each, a region apiece).

Formats: Q4_K records, Q6_K row quads and Q8_0 on the byte dot-product kernels (every level but
portable, engine/cpu/isa.py); other formats and levels keep the loop of per-expert matmuls
(`expert_matmul_kernel` returns None for them).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import get_num_threads, njit, prange

from engine.cpu.chunks import chunk_starts, take_next
from engine.cpu.matmul.activations import ACT_Q8_K, _activation_quads, _activation_sums32, _quantize
from engine.cpu.matmul.intrinsics import BYTE_DOT
from engine.cpu.matmul.q4k import _q4k_record_tile_to
from engine.cpu.matmul.q6k import _activation_sums16, _q6k_row_quad_tile_to
from engine.cpu.matmul.q8 import _adjacent_pairs, _q8_tile_vnni_to
from engine.cpu.matmul.tiles import _KERNEL
from engine.quant import ROWS, PackedWeight, QType


@njit(inline="always")
def _span_tiles(t_start, t_end, tile, args, g, go) -> None:  # type: ignore[no-untyped-def]
    """Rows t_start .. t_end of weight row group g into out's row group go, in tiles, the largest first
    (engine/cpu/matmul/tiles.py's _each_tile over a span)."""
    t0 = t_start
    while t0 < t_end:
        left = t_end - t0
        if left >= 8:
            tile(args, g, go, t0, 8)
            t0 += 8
        elif left >= 4:
            tile(args, g, go, t0, 4)
            t0 += 4
        elif left >= 2:
            tile(args, g, go, t0, 2)
            t0 += 2
        else:
            tile(args, g, go, t0, 1)
            t0 += 1


@njit(inline="always")
def _each_item(tile, args, per, runs, n_threads) -> None:  # type: ignore[no-untyped-def]
    """The parallel loop: items i = (run i // per, row group i % per of its expert) in chunks."""
    starts, taken = chunk_starts(runs.shape[0] * per, n_threads), np.zeros(1, np.int64)
    for _ in prange(n_threads):
        c = take_next(taken)
        while c < starts.shape[0] - 1:
            for i in range(starts[c], starts[c + 1]):
                run, go = i // per, i % per
                _span_tiles(runs[run, 1], runs[run, 2], tile, args, runs[run, 0] * per + go, go)
            c = take_next(taken)


@njit(parallel=True, **_KERNEL)
def _experts_q4k_records(x, rec, rec16, mn, per, runs, out, n_threads) -> None:  # type: ignore[no-untyped-def]
    xq, xd, _ = _quantize(x, ACT_Q8_K)
    a = (rec, rec16, mn, _activation_quads(xq), xd, _activation_sums32(xq), out)
    _each_item(_q4k_record_tile_to, a, per, runs, n_threads)


@njit(parallel=True, **_KERNEL)
def _experts_q6k_row_quads(x, qs, qh, sc, d, per, runs, out, n_threads) -> None:  # type: ignore[no-untyped-def]
    xq, xd, _ = _quantize(x, ACT_Q8_K)
    a = (qs, qh, sc, d, _activation_quads(xq), _activation_sums16(xq), xd, out)
    _each_item(_q6k_row_quad_tile_to, a, per, runs, n_threads)


@njit(parallel=True, **_KERNEL)
def _experts_q8(x, qs, d, per, runs, out, n_threads) -> None:  # type: ignore[no-untyped-def]
    xq, xd, _ = _quantize(x)
    a = (qs, d, _adjacent_pairs(xq), _activation_quads(xq), _activation_sums32(xq), xd, out)
    _each_item(_q8_tile_vnni_to, a, per, runs, n_threads)


ExpertKernel = Callable[[np.ndarray, PackedWeight, int, np.ndarray, np.ndarray], None]


def expert_matmul_kernel(w: PackedWeight) -> ExpertKernel | None:
    """The one-call kernel for w's format and layout, or None (the caller loops over the experts)."""
    if not BYTE_DOT:
        return None
    if w.qtype == QType.Q4_K and w.repacked:
        return lambda x, w, per, runs, out: _experts_q4k_records(
            x, w.qs, w.qs.view(np.uint16), w.mn, per, runs, out, get_num_threads()
        )
    if w.qtype == QType.Q6_K and w.repacked:
        return lambda x, w, per, runs, out: _experts_q6k_row_quads(
            x, w.qs, w.qh, w.sc, w.d, per, runs, out, get_num_threads()
        )
    if w.qtype == QType.Q8_0:
        return lambda x, w, per, runs, out: _experts_q8(x, w.qs, w.d, per, runs, out, get_num_threads())
    return None


def experts_matmul(x: np.ndarray, w: PackedWeight, rows: int, runs: np.ndarray, out: np.ndarray) -> bool:
    """out[s:e] = x[s:e] @ W_expert.T for each (expert, s, e) of runs (int64 [n, 3]); w holds the experts'
    `rows`-row matrices one after another. False (nothing done) where w's format has no such kernel."""
    kernel = expert_matmul_kernel(w)
    if kernel is None:
        return False
    contiguous = x.flags.c_contiguous and out.flags.c_contiguous
    if x.dtype != np.float32 or out.dtype != np.float32 or not contiguous:
        raise ValueError("experts_matmul needs C-contiguous float32 x and out")
    if rows % ROWS:
        return False
    if x.shape[1] != w.n_cols or out.shape != (x.shape[0], rows) or w.n_rows % rows:
        raise ValueError(f"experts_matmul shapes: x {x.shape}, w ({w.n_rows}, {w.n_cols}), rows {rows}")
    kernel(x, w, rows // ROWS, runs, out)
    return True
