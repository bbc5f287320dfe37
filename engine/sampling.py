"""Token sampling: llama.cpp's default sampler chain, vectorised with numpy.

llama-server's default chain (common/sampling.cpp) is

    logit-bias -> penalties -> dry -> top-n-sigma -> top-k -> typical -> top-p -> min-p -> xtc
    -> temperature -> dist

DRY, top-n-sigma, typical and XTC are off at llama-server's defaults (multiplier 0, sigma -1, p 1.0,
probability 0) and are not offered here, so the chain reduces to bias, penalties, top-k, top-p,
min-p, temperature and a weighted draw. With temperature <= 0 llama.cpp's temperature stage keeps only
the highest logit, so the result is the argmax of the biased, penalised logits.

Work is kept to a few O(n_vocab) numpy passes plus sorts over the few surviving candidates (a full
sort of Gemma 3's 262,144-entry vocabulary costs ~30 ms). Measured on that vocabulary: ~0.3 ms per
token with the default chain, ~4 ms at worst with top-k and min-p both off and top-p on.
"""

from __future__ import annotations

import math
import secrets
from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np

# top-p sorts candidate lists up to this long; longer ones are bucketed by value first.
_TOP_P_SORT_ALL = 4096
_TOP_P_BUCKETS = 2048
_RANDOM_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED
# the weighted draw sums blocks of this many candidates first, then searches one block
_PICK_BLOCK = 4096


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40  # <= 0: off
    top_p: float = 0.95  # >= 1: off
    min_p: float = 0.05  # <= 0: off
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64  # 0: penalties off; < 0: the whole history (llama-server maps -1 to n_ctx)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)  # -inf bans a token
    seed: int = -1  # < 0 (or 0xFFFFFFFF, llama.cpp's -1 as uint32): random
    n_probs: int = 0  # top log-probs to report per token

    def __post_init__(self) -> None:
        if self.repeat_penalty <= 0:
            raise ValueError(f"repeat_penalty must be > 0, got {self.repeat_penalty}")
        if self.n_probs < 0:
            raise ValueError(f"n_probs must be >= 0, got {self.n_probs}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @property
    def has_penalties(self) -> bool:
        return self.repeat_last_n != 0 and (
            self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
        )


class Sampler:
    """One per sequence: owns its RNG and its penalty history. Not thread-safe (one engine thread)."""

    def __init__(self, params: SamplingParams, n_vocab: int) -> None:
        self.params = params
        self.n_vocab = n_vocab
        # The seed actually used, so a random one can still be reported (llama-server returns it).
        # llama.cpp's seeds are uint32 and its "random" marker, -1, arrives as 0xFFFFFFFF just as often.
        random = params.seed < 0 or params.seed == _RANDOM_SEED
        self.seed: int = secrets.randbits(32) if random else params.seed
        self._rng = np.random.Generator(np.random.PCG64(self.seed))
        self._bias_ids, self._bias_values = _bias_arrays(params.logit_bias, n_vocab)
        window = params.repeat_last_n
        self._window: int | None = window if window >= 0 else None
        self._history: deque[int] = deque()
        self._counts: Counter[int] = Counter()

    def accept(self, token: int) -> None:
        """Record a prompt or generated token in the penalty window (the caller accepts the sampled one)."""
        if self._window == 0:
            return
        self._history.append(token)
        self._counts[token] += 1
        if self._window is not None and len(self._history) > self._window:
            old = self._history.popleft()
            self._counts[old] -= 1
            if self._counts[old] == 0:
                del self._counts[old]

    def sample(self, logits: np.ndarray, draft: int | None = None) -> int:
        """Pick the next token; `logits` (float32 [n_vocab]) is not modified.

        With a `draft` token (speculative decoding) the pick is still exactly a draw from the chain's
        distribution: greedy picks the best token whatever the draft; otherwise the draft is accepted
        with its probability and, if refused, a token is drawn from the rest, renormalised (speculative
        sampling with a deterministic draft: P(t) = p(t) for every t).
        """
        work = self.adjust(logits)
        best = int(np.argmax(work))  # first maximum: lowest id wins ties
        if self.params.greedy or not np.isfinite(work[best]):
            # All-banned logits (max -inf) have no distribution; the lowest id is a defined answer.
            return best
        ids, values = self._candidates(work)
        if draft is None:
            return self._draw(ids, values)
        return self._verify(ids, values, draft)

    def adjust(self, logits: np.ndarray) -> np.ndarray:
        """The logits after the bias and penalty stages: a copy, or the input itself when neither applies."""
        self._check(logits)
        penalise = self.params.has_penalties and bool(self._counts)
        if not self._bias_ids.size and not penalise:
            return logits
        work = logits.astype(np.float32, copy=True)
        if self._bias_ids.size:
            work[self._bias_ids] += self._bias_values
        if penalise:
            self._apply_penalties(work)
        return work

    def post_sampling_probs(self, logits: np.ndarray, k: int) -> list[tuple[int, float]]:
        """The k best candidates that survive the chain, with the probabilities the draw uses.

        llama-server's `post_sampling_probs` view: after bias, penalties, truncation and temperature.
        At temperature <= 0 the best candidate has probability 1 and the others 0, as in llama.cpp.
        """
        work = self.adjust(logits)
        best = int(np.argmax(work))
        if not np.isfinite(work[best]):
            return [(best, 1.0)][:k]
        ids, values = self._candidates(work)
        order = _best_first(values)[: max(k, 0)]
        if self.params.greedy:
            probs = np.zeros(order.size)
            probs[:1] = 1.0
        else:
            weights = _scaled_weights(values, self.params.temperature)
            probs = weights[order] / weights.sum(dtype=np.float64)
        token_ids = order if ids is None else ids[order]
        return [(int(t), float(q)) for t, q in zip(token_ids, probs, strict=True)]

    def top_logprobs(self, logits: np.ndarray, k: int) -> list[tuple[int, float]]:
        """The k most likely tokens of the raw distribution, best first (ties: lowest id), with log-probs.

        llama-server reports probabilities of the unmodified logits (no bias, penalties, truncation or
        temperature) unless a request asks for post-sampling probabilities.
        """
        self._check(logits)
        k = min(k, logits.size)
        if k <= 0:
            return []
        ids = _top_ids(logits, k)
        lse = _logsumexp(logits)
        return [(int(i), float(logits[i]) - lse) for i in ids]

    def token_logprob(self, logits: np.ndarray, token: int) -> float:
        """Log-probability of `token` under the raw distribution (what llama-server reports per token)."""
        self._check(logits)
        return float(logits[token]) - _logsumexp(logits)

    # -- chain stages --------------------------------------------------------------------------------

    def _check(self, logits: np.ndarray) -> None:
        if logits.shape != (self.n_vocab,):
            raise ValueError(f"expected logits of shape ({self.n_vocab},), got {logits.shape}")

    def _apply_penalties(self, work: np.ndarray) -> None:
        p = self.params
        ids = np.fromiter(self._counts.keys(), dtype=np.int64, count=len(self._counts))
        counts = np.fromiter(self._counts.values(), dtype=np.float32, count=len(self._counts))
        inside = (ids >= 0) & (ids < self.n_vocab)
        ids, counts = ids[inside], counts[inside]
        values = work[ids]
        # Dividing a negative logit would raise its probability, hence multiply those (as llama.cpp).
        repeat = np.float32(p.repeat_penalty)
        values = np.where(values <= 0, values * repeat, values / repeat)
        values -= counts * np.float32(p.frequency_penalty) + np.float32(p.presence_penalty)
        work[ids] = values

    def _candidates(self, work: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        """top-k, then top-p and min-p: surviving ids (None: all of them, in id order) and their logits."""
        p = self.params
        # ids None: every position of `work` is still a candidate (no gather of the whole vocabulary).
        ids: np.ndarray | None = None
        values = work
        if 0 < p.top_k < work.size:
            ids = _top_ids(work, p.top_k)
            values = work[ids]
        top = np.float32(values.max())
        # top-p runs before min-p, but both keep a best-first prefix and min-p's threshold depends only
        # on the (unchanged) best logit, so cutting min-p first and top-p against the pre-min-p mass
        # gives the same set with far less sorting.
        weights = _scaled_weights(values, 1.0) if p.top_p < 1 else None
        total = float(weights.sum(dtype=np.float64)) if weights is not None else 1.0
        if p.min_p > 0:
            keep = np.flatnonzero(values >= top + np.float32(math.log(p.min_p)))
            ids = keep if ids is None else ids[keep]
            values = values[keep]
            weights = weights[keep] if weights is not None else None
        if weights is not None:
            order = _top_p_order(values, weights, total, p.top_p)
            ids = order if ids is None else ids[order]
            values = values[order]
        return ids, values

    def _verify(self, ids: np.ndarray | None, values: np.ndarray, draft: int) -> int:
        """Accept `draft` with its probability p(draft); else draw from p without it, renormalised."""
        weights = _scaled_weights(values, self.params.temperature)
        at = _position(ids, draft, weights.size)
        if at is not None:
            total = float(weights.sum(dtype=np.float64))
            if self._rng.random() * total < float(weights[at]):
                return draft
            weights[at] = 0.0
            if not weights.any():  # the draft was the only candidate left after all
                return draft
        index = _weighted_pick(weights, self._rng.random())
        return index if ids is None else int(ids[index])

    def _draw(self, ids: np.ndarray | None, values: np.ndarray) -> int:
        """Temperature, then a weighted draw; `ids` None means values are indexed by token id."""
        if values.size == 1:
            index = 0  # llama.cpp's dist stage also skips the RNG here
        else:
            index = _weighted_pick(_scaled_weights(values, self.params.temperature), self._rng.random())
        return index if ids is None else int(ids[index])


def _position(ids: np.ndarray | None, token: int, n: int) -> int | None:
    """Where `token` is among the candidates (`ids` None: every id, in order), None if it was cut."""
    if ids is None:
        return token if 0 <= token < n else None
    found = np.flatnonzero(ids == token)
    return int(found[0]) if found.size else None


def _scaled_weights(values: np.ndarray, temperature: float) -> np.ndarray:
    """exp((values - max) / temperature) as float32, in one fresh buffer.

    In place on purpose: chains of numpy temporaries over 262k entries measured ~8x slower here.
    """
    weights = values - values.max()
    if temperature != 1.0:
        weights /= np.float32(temperature)
    return np.exp(weights, out=weights)


def _weighted_pick(weights: np.ndarray, uniform: float) -> int:
    """Index drawn with probability proportional to `weights`, from one uniform number in [0, 1).

    Two levels (block sums, then one block) instead of a cumulative sum over the whole vocabulary,
    which costs ~1 ms of fresh memory on 262k entries. A zero weight is never picked.
    """
    n = weights.size
    starts = np.arange(0, n, _PICK_BLOCK)
    block_cumulative = np.cumsum(np.add.reduceat(weights, starts, dtype=np.float64))
    target = uniform * block_cumulative[-1]
    block = min(int(np.searchsorted(block_cumulative, target, side="right")), starts.size - 1)
    if block > 0:
        target -= block_cumulative[block - 1]
    chunk = weights[starts[block] : starts[block] + _PICK_BLOCK]
    local = np.cumsum(chunk, dtype=np.float64)
    # side="right": the first entry whose running mass exceeds the target, so never a zero weight.
    offset = int(np.searchsorted(local, target, side="right"))
    if offset >= chunk.size:  # rounding carried the target past the block's end
        offset = int(np.flatnonzero(chunk)[-1])
    return int(starts[block]) + offset


def _bias_arrays(bias: dict[int, float], n_vocab: int) -> tuple[np.ndarray, np.ndarray]:
    # llama-server silently drops biases for ids outside the vocabulary.
    items = [(int(t), float(b)) for t, b in bias.items() if 0 <= int(t) < n_vocab]
    ids = np.array([t for t, _ in items], dtype=np.int64)
    values = np.array([b for _, b in items], dtype=np.float32)
    return ids, values


def _best_first(values: np.ndarray) -> np.ndarray:
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


def _top_ids(values: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k largest values, best first, ties by lowest position (also at the cut).

    Banned tokens (-inf: a grammar's mask, a logit bias) are set aside first: they have no probability,
    and numpy's partition degrades on many equal values (24 ms instead of 1.6 ms on Gemma 3's 262k
    logits with all but 20 masked; finding the allowed ones costs 0.05 ms).
    """
    allowed = np.flatnonzero(values > -np.inf)
    if allowed.size < values.size:
        return allowed[_top_ids_of(values[allowed], k)]
    return _top_ids_of(values, k)


def _top_ids_of(values: np.ndarray, k: int) -> np.ndarray:
    n = values.size
    if k >= n:
        return _best_first(values)
    ids = _at_least_kth(values, k)
    return ids[_best_first(values[ids])][:k]


def _at_least_kth(values: np.ndarray, k: int) -> np.ndarray:
    """Ascending positions of every value >= the k-th largest: the top k plus whatever ties the k-th."""
    kth = np.partition(values, values.size - k)[values.size - k]
    return np.flatnonzero(values >= kth)


def _top_p_order(values: np.ndarray, weights: np.ndarray, total: float, top_p: float) -> np.ndarray:
    """Positions of the smallest best-first prefix whose probability mass reaches top_p (unordered).

    Positions stand in for ids when breaking ties: candidate arrays are always in ascending-id order or
    best-first with ties by ascending id. Long lists are bucketed by value (one bincount) so that only
    the bucket where the mass crosses top_p gets sorted, whatever the shape of the distribution.
    """
    if values.size <= _TOP_P_SORT_ALL:
        order = _best_first(values)
        return order[: _mass_cut(weights[order], 0.0, total, top_p)]
    top = values.max()
    # exp() underflows to 0 below top - 104, so a wider range would only spread the buckets thinner.
    low = max(values.min(), top - np.float32(104))
    scale = np.float32(_TOP_P_BUCKETS / (top - low)) if top > low else np.float32(0)
    # Bucket 0 holds the best values; -inf lands in the last bucket.
    distance = top - values
    distance *= scale
    buckets = np.minimum(distance, np.float32(_TOP_P_BUCKETS - 1), out=distance).astype(np.intp)
    cumulative = np.cumsum(np.bincount(buckets, weights=weights, minlength=_TOP_P_BUCKETS))
    crossing = min(int(np.searchsorted(cumulative, top_p * total, side="left")), _TOP_P_BUCKETS - 1)
    border = np.flatnonzero(buckets == crossing)
    border = border[_best_first(values[border])]
    before = float(cumulative[crossing - 1]) if crossing > 0 else 0.0
    kept = border[: _mass_cut(weights[border], before, total, top_p)]
    return np.concatenate((np.flatnonzero(buckets < crossing), kept))


def _mass_cut(sorted_weights: np.ndarray, before: float, total: float, top_p: float) -> int:
    """How many of these best-first weights, after `before` mass, it takes to first reach top_p (all
    of them when rounding never gets there)."""
    cumulative = before + np.cumsum(sorted_weights.astype(np.float64))
    return int(np.searchsorted(cumulative / total, top_p, side="left")) + 1


def _logsumexp(logits: np.ndarray) -> float:
    return float(logits.max()) + math.log(float(_scaled_weights(logits, 1.0).sum(dtype=np.float64)))
