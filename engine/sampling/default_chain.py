"""llama-server's default chain, fast: top-k, top-p and min-p as a few vectorised passes.

The Sampler takes this path when the chain's active stages are a subsequence of penalties, top-k,
top-p, min-p and temperature in that order, with min_keep 0 (llama-server's defaults and what most
clients send). The bias and penalties are applied to the logit vector first (Sampler.adjust). Measured
on Gemma 3's 262,144-entry vocabulary (scripts/bench_text.py): ~0.3 ms per token with top-k off, ~2 ms
with llama-server's defaults (numpy's partition for top-k), ~2-4 ms with top-k and min-p off and top-p
on. Candidates come out in llama.cpp's order (best first after top-k or top-p, id order otherwise), so
seeded draws pick what llama.cpp picks.
"""

from __future__ import annotations

import math

import numpy as np

from engine.sampling.arrays import dist_weights, mass_prefix, top_ids
from engine.sampling.params import SamplingParams

FAST_ORDER = ("penalties", "top_k", "top_p", "min_p", "temperature")


def takes_fast_path(params: SamplingParams) -> bool:
    """Whether the active stages, in their order, are the default chain's (or part of it), with
    nothing the fast path leaves out (mirostat, min_keep, a dynamic temperature)."""
    if params.mirostat or params.min_keep or params.dynatemp_range > 0:
        return False
    positions = [FAST_ORDER.index(s) if s in FAST_ORDER else -1 for s in params.chain()]
    return -1 not in positions and positions == sorted(set(positions))


def candidates(
    work: np.ndarray, top_k: int, top_p: float, min_p: float
) -> tuple[np.ndarray | None, np.ndarray]:
    """top-k, then top-p and min-p: surviving ids (None: all of them, in id order) and their logits."""
    # ids None: every position of `work` is still a candidate (no gather of the whole vocabulary).
    ids: np.ndarray | None = None
    values = work
    if 0 < top_k < work.size:
        ids = top_ids(work, top_k)
        values = work[ids]
    top = np.float32(values.max())
    # top-p runs before min-p, but both keep a best-first prefix and min-p's threshold depends only
    # on the (unchanged) best logit, so cutting min-p first and top-p against the pre-min-p mass
    # gives the same set with far less sorting.
    weights = dist_weights(values) if top_p < 1 else None
    total = float(weights.sum(dtype=np.float64)) if weights is not None else 1.0
    if min_p > 0:
        keep = np.flatnonzero(values >= top + np.float32(math.log(min_p)))
        ids = keep if ids is None else ids[keep]
        values = values[keep]
        weights = weights[keep] if weights is not None else None
    if weights is not None:
        order, _ = mass_prefix(values, weights, total, top_p)
        ids = order if ids is None else ids[order]
        values = values[order]
    return ids, values
