"""numpy building blocks of the sampler: orderings, top-k, probability-mass cuts and the weighted draw.

They keep the work on Gemma 3's 262,144-entry vocabulary to a few O(n) passes: a full sort of it costs
~25 ms (np.sort) to ~60 ms (a stable argsort), so nothing here sorts more than the candidates that
survive. Ties are broken by position, and positions stand for token ids: candidate arrays are either in
id order or best-first with ties by ascending id.
"""

from __future__ import annotations

import math

import numpy as np

# mass cuts sort candidate lists up to this long; longer ones are bucketed by value first.
SORT_ALL = 4096
_BUCKETS = 2048
# the weighted draw sums blocks of this many candidates first, then searches one block
_PICK_BLOCK = 4096


def best_first(values: np.ndarray) -> np.ndarray:
    """Positions of float32 `values` by descending value, ties by ascending position.

    One int64 sort instead of np.lexsort (5x slower): the high half of each key is the value's bits
    mapped to an order-reversing integer, the low half its position.
    """
    bits = (values + np.float32(0)).view(np.int32)  # + 0 folds -0.0 into 0.0
    descending = ~(bits ^ ((bits >> 31) & np.int32(0x7FFFFFFF)))
    keys = descending.astype(np.int64) << 32
    keys |= np.arange(values.size, dtype=np.int64)
    keys.sort()
    return keys & 0xFFFFFFFF


def top_ids(values: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k largest values, best first, ties by lowest position (also at the cut).

    Banned tokens (-inf: a grammar's mask, a logit bias) are set aside first: they have no probability,
    and numpy's partition degrades on many equal values (24 ms instead of 1.6 ms on Gemma 3's 262k
    logits with all but 20 masked; finding the allowed ones costs 0.05 ms). Fewer than k come back
    when fewer than k are allowed.
    """
    allowed = np.flatnonzero(values > -np.inf)
    if allowed.size < values.size:
        return allowed[_top_ids_of(values[allowed], k)]
    return _top_ids_of(values, k)


def _top_ids_of(values: np.ndarray, k: int) -> np.ndarray:
    if k >= values.size:
        return best_first(values)
    kth = np.partition(values, values.size - k)[values.size - k]
    ids = np.flatnonzero(values >= kth)  # the top k plus whatever ties the k-th
    return ids[best_first(values[ids])][:k]


def mass_prefix(
    values: np.ndarray, weights: np.ndarray, total: float, p: float, strict: bool = False
) -> tuple[np.ndarray, bool]:
    """Positions of the smallest best-first prefix whose probability mass reaches p (top-p's cut; with
    `strict`, exceeds it: typical-p's), and whether they come best first.

    They do when the list is short or the prefix is; a long list is bucketed by value (one bincount)
    so that only the bucket where the mass crosses p gets sorted, whatever the distribution's shape,
    and its prefix is then sorted only if it has at most SORT_ALL * 4 entries (else it comes back
    unordered: the same set, drawn from in another order than llama.cpp's).
    """
    if values.size <= SORT_ALL:
        order = best_first(values)
        return order[: mass_cut(weights[order], 0.0, total, p, strict)], True
    top = values.max()
    # exp() underflows to 0 below top - 104, so a wider range would only spread the buckets thinner.
    low = max(values.min(), top - np.float32(104))
    scale = np.float32(_BUCKETS / (top - low)) if top > low else np.float32(0)
    # Bucket 0 holds the best values; -inf lands in the last bucket.
    distance = top - values
    distance *= scale
    buckets = np.minimum(distance, np.float32(_BUCKETS - 1), out=distance).astype(np.intp)
    cumulative = np.cumsum(np.bincount(buckets, weights=weights, minlength=_BUCKETS))
    side = "right" if strict else "left"
    crossing = min(int(np.searchsorted(cumulative, p * total, side=side)), _BUCKETS - 1)
    border = np.flatnonzero(buckets == crossing)
    border = border[best_first(values[border])]
    before = float(cumulative[crossing - 1]) if crossing > 0 else 0.0
    kept = np.concatenate(
        (np.flatnonzero(buckets < crossing), border[: mass_cut(weights[border], before, total, p, strict)])
    )
    if kept.size > SORT_ALL * 4:
        return kept, False
    return kept[best_first(values[kept])], True


def mass_cut(sorted_weights: np.ndarray, before: float, total: float, p: float, strict: bool = False) -> int:
    """How many of these best-first weights, after `before` mass, it takes to first reach p (exceed it,
    with `strict`); all of them when rounding never gets there."""
    cumulative = before + np.cumsum(sorted_weights.astype(np.float64))
    return int(np.searchsorted(cumulative / total, p, side="right" if strict else "left")) + 1


def dist_weights(logits: np.ndarray) -> np.ndarray:
    """exp(logits - max) as float32 in one fresh buffer: llama.cpp's dist stage (expf per candidate).

    In place on purpose: chains of numpy temporaries over 262k entries measured ~8x slower here.
    """
    weights = logits - logits.max()
    return np.exp(weights, out=weights)


def scaled(values: np.ndarray, temperature: float) -> np.ndarray:
    """llama.cpp's temperature stage (logit / t, float32) in a fresh buffer; t == 1 copies nothing."""
    if temperature == 1.0:
        return values
    return values / np.float32(temperature)


def weighted_pick(weights: np.ndarray, uniform: float) -> int:
    """The first index whose running sum of `weights` reaches uniform * total (llama.cpp's dist stage).

    Two levels (block sums, then one block) instead of a cumulative sum over the whole vocabulary,
    which costs ~1 ms of fresh memory on 262k entries.
    """
    n = weights.size
    starts = np.arange(0, n, _PICK_BLOCK)
    block_cumulative = np.cumsum(np.add.reduceat(weights, starts, dtype=np.float64))
    target = uniform * block_cumulative[-1]
    block = min(int(np.searchsorted(block_cumulative, target, side="left")), starts.size - 1)
    if block > 0:
        target -= block_cumulative[block - 1]
    chunk = weights[starts[block] : starts[block] + _PICK_BLOCK]
    local = np.cumsum(chunk, dtype=np.float64)
    offset = int(np.searchsorted(local, target, side="left"))
    if offset >= chunk.size:  # rounding carried the target past the block's end
        offset = int(np.flatnonzero(chunk)[-1])
    return int(starts[block]) + offset


def discrete_pick(probs: np.ndarray, uniform: float) -> int:
    """std::discrete_distribution's draw (libstdc++), which mirostat uses: cumulative normalised
    probabilities in double with the last forced to 1, then the first one >= the uniform number."""
    cumulative = np.cumsum(probs.astype(np.float64) / float(np.cumsum(probs, dtype=np.float64)[-1]))
    cumulative[-1] = 1.0
    return int(np.searchsorted(cumulative, uniform, side="left"))


def softmax32(logits: np.ndarray) -> np.ndarray:
    """llama.cpp's softmax: float32 expf(l - max), summed in order in float32, divided (so a cut that
    compares probabilities with a threshold falls where llama.cpp's does)."""
    probs = dist_weights(logits)
    probs /= np.cumsum(probs)[-1]
    return probs


def positions_of(ids: np.ndarray | None, size: int, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where `tokens` are among candidates `ids` (None: every id, in order): (positions, which tokens)."""
    if ids is None:
        which = np.flatnonzero((tokens >= 0) & (tokens < size))
        return tokens[which], which
    order = np.argsort(ids, kind="stable")
    at = np.minimum(np.searchsorted(ids[order], tokens), ids.size - 1)
    which = np.flatnonzero(ids[order[at]] == tokens)
    return order[at[which]], which


def logsumexp(logits: np.ndarray) -> float:
    return float(logits.max()) + math.log(float(dist_weights(logits).sum(dtype=np.float64)))
