"""The general chain's stages, each as llama.cpp's src/llama-sampler.cpp defines it, on `Candidates`.

A stage sees the candidates the previous ones left, in their order, and may reorder (`sorted`: best
first), cut, or change logits. Probabilities are computed as llama.cpp computes them (float32, summed in
order) so that a cut against a threshold falls where llama.cpp's does. Where llama.cpp sorts, this sorts
too, except on lists longer than LONG (a whole 262k vocabulary takes ~15-25 ms to sort, ~60 ms for a
stable argsort): there top-p and typical-p cut by value buckets (arrays.mass_prefix), XTC finds its few
top choices directly, and dynamic temperature needs no order at all. The candidates, their logits and
probabilities are the same; only the order the draw walks differs from llama.cpp's, so a seeded pick
can differ on such lists. Ties are broken by lowest token id, where llama.cpp leaves the order
unspecified. One deliberate difference: typical-p ignores zero-probability candidates in its entropy,
where llama.cpp's sum turns NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from engine.sampling.arrays import SORT_ALL, best_first, mass_prefix, positions_of, softmax32, top_ids
from engine.sampling.rng import LlamaRng

LONG = 4 * SORT_ALL  # candidate lists longer than this are not sorted just to order the draw


@dataclass
class Candidates:
    """`ids` None: the whole vocabulary in id order; `logits` float32, owned by the chain."""

    ids: np.ndarray | None
    logits: np.ndarray
    sorted: bool = False

    @property
    def size(self) -> int:
        return int(self.logits.size)

    def keep(self, positions: np.ndarray, now_sorted: bool) -> None:
        self.ids = positions if self.ids is None else self.ids[positions]
        self.logits = self.logits[positions]
        self.sorted = now_sorted

    def sort(self) -> None:
        if not self.sorted:
            self.keep(best_first(self.logits), True)

    def softmax(self, sort: bool) -> np.ndarray:
        """llama.cpp's softmax, sorting first when asked (and the list is not LONG)."""
        if sort and self.size <= LONG:
            self.sort()
        return softmax32(self.logits)

    def adjust(self, tokens: np.ndarray, amounts: np.ndarray, scale: float | None = None) -> None:
        """Penalise `tokens` where they are still candidates: logit * or / scale (by sign), - amount."""
        at, which = positions_of(self.ids, self.size, tokens)
        values = self.logits[at]
        if scale is not None:
            # Dividing a negative logit would raise its probability, hence multiply those (as llama.cpp).
            values = np.where(values <= 0, values * np.float32(scale), values / np.float32(scale))
        self.logits[at] = values - amounts[which]
        self.sorted = False


def top_k(c: Candidates, k: int) -> None:
    if k <= 0:
        return
    k = min(k, c.size)
    if c.sorted:
        c.keep(np.arange(k), True)
        return
    kept = top_ids(c.logits, k)
    if kept.size < k:  # llama.cpp fills k with banned (-inf) candidates too
        rest = np.setdiff1d(np.arange(c.size), kept, assume_unique=True)
        kept = np.concatenate((kept, rest[: k - kept.size]))
    c.keep(kept, True)


def top_p(c: Candidates, p: float, min_keep: int) -> None:
    if p >= 1:
        return
    probs = c.softmax(sort=False)
    if not c.sorted and c.size > LONG and min_keep <= 1:
        # A long unsorted list: bucket by value instead of sorting all of it (arrays.mass_prefix).
        c.keep(*mass_prefix(c.logits, probs, float(probs.sum(dtype=np.float64)), p))
        return
    if not c.sorted:
        order = best_first(c.logits)
        c.keep(order, True)
        probs = probs[order]
    cumulative = np.cumsum(probs)  # float32, in order, as llama.cpp sums
    reached = np.flatnonzero(cumulative >= np.float32(p))
    reached = reached[reached + 1 >= min_keep]
    c.keep(np.arange(reached[0] + 1 if reached.size else c.size), True)


def min_p(c: Candidates, p: float, min_keep: int) -> None:
    if p <= 0 or not c.size:
        return
    log_p = np.float32(math.log(p))
    if not c.sorted:
        kept = np.flatnonzero(c.logits >= c.logits.max() + log_p)
        if kept.size and kept.size >= min_keep:
            c.keep(kept, False)
            return
        c.sort()
    below = np.flatnonzero(c.logits[1:] < c.logits[0] + log_p) + 1
    below = below[below >= min_keep]
    c.keep(np.arange(below[0] if below.size else c.size), True)


def typical(c: Candidates, p: float, min_keep: int) -> None:
    """Locally typical sampling: the candidates whose surprise is closest to the entropy, until their
    mass exceeds p, in that order."""
    if p >= 1:
        return
    probs = c.softmax(sort=True)
    with np.errstate(divide="ignore"):
        surprise = -np.log(probs)
    entropy = np.cumsum(np.where(probs > 0, probs * surprise, np.float32(0)))[-1]
    distance = np.abs(surprise - entropy)
    if not c.sorted and min_keep <= 1:  # a LONG list: bucket by distance instead of sorting it all
        total = float(probs.sum(dtype=np.float64))
        kept, _ = mass_prefix(-distance, probs, total, p, strict=True)
        c.keep(kept, False)
        return
    order = np.argsort(distance, kind="stable")
    cumulative = np.cumsum(probs[order])
    passed = np.flatnonzero(cumulative > np.float32(p))
    passed = passed[(min_keep == 0) | (passed >= min_keep - 1)]
    c.keep(order[: passed[0] + 1 if passed.size else c.size], False)


def top_n_sigma(c: Candidates, n: float) -> None:
    """Candidates more than n standard deviations below the best logit become -inf (not removed)."""
    if n <= 0 or c.size <= 1:
        return
    finite = c.logits[c.logits != -np.inf].astype(np.float64)
    if not finite.size:
        return
    threshold = np.float32(finite.max() - np.float32(n) * np.float32(finite.std()))
    c.logits[c.logits < threshold] = -np.inf


def xtc(c: Candidates, probability: float, threshold: float, min_keep: int, rng: LlamaRng) -> None:
    """Exclude Top Choices: with some chance, every candidate above the threshold but the least likely
    of them is removed."""
    if probability <= 0 or threshold > 0.5 or c.size < 2:
        return
    if rng.uniform_f32() > np.float32(probability):
        return
    probs = c.softmax(sort=True)
    above = np.flatnonzero(probs >= np.float32(threshold))
    if not c.sorted:  # a LONG list: its few top choices (at most 1 / threshold), best first
        above = above[best_first(c.logits[above])]
        if c.size - (above.size - 1) >= min_keep and above.size > 1:
            c.keep(np.setdiff1d(np.arange(c.size), above[:-1], assume_unique=True), False)
        return
    first_below = np.flatnonzero(probs < np.float32(threshold))
    last = (int(first_below[0]) if first_below.size else c.size) - 1
    if c.size - last >= min_keep and last > 0:
        c.keep(np.arange(last, c.size), True)


def temperature(c: Candidates, temp: float, delta: float, exponent: float) -> None:
    """llama.cpp's temp-ext: with delta > 0 the temperature follows the candidates' normalised entropy
    between temp - delta and temp + delta (in float32, as llama.cpp computes it); else plain."""
    if delta <= 0:
        plain_temperature(c, temp)
        return
    if c.size <= 1:
        return
    f32 = np.float32
    max_entropy = -np.log(f32(1) / f32(c.size))
    probs = c.softmax(sort=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        entropy = -np.cumsum(np.where(probs > 0, probs * np.log(probs), f32(0)))[-1]
    low, high = max(f32(0), f32(temp) - f32(delta)), f32(temp) + f32(delta)
    plain_temperature(c, float(low + (high - low) * np.power(entropy / max_entropy, f32(exponent))))


def plain_temperature(c: Candidates, temp: float) -> None:
    """logit / temp; temp <= 0 keeps the first best candidate and sets the others to -inf."""
    if not c.size:
        return
    if temp <= 0:
        best = int(np.argmax(c.logits))
        value = c.logits[best]
        c.logits[:] = -np.inf
        c.logits[best] = value
        return
    c.logits /= np.float32(temp)
