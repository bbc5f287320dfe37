"""`Distribution`: what a sampler chain leaves to draw from, and llama-server's post-sampling view of it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from engine.sampling.arrays import discrete_pick, dist_weights, positions_of, scaled, top_ids, weighted_pick
from engine.sampling.rng import LlamaRng


@dataclass
class Distribution:
    """The candidates at the end of the chain, in the chain's order, and their draw weights.

    `ids` None: every token, in id order. `values` are their logits before a last `temperature` (the
    fast path divides while computing the weights: one buffer fewer on a 262k vocabulary). `weights`
    are exp(logit - max) in float32 (0 for a banned token), the probabilities once divided by `total`.
    """

    ids: np.ndarray | None
    values: np.ndarray
    weights: np.ndarray
    temperature: float = 1.0

    @classmethod
    def of(cls, ids: np.ndarray | None, values: np.ndarray, temperature: float = 1.0) -> Distribution:
        """llama.cpp's temperature (logit / t in float32) then dist's weights, in one fresh buffer."""
        if temperature == 1.0:
            weights = dist_weights(values)
        else:
            weights = values / np.float32(temperature)
            weights -= weights.max()
            np.exp(weights, out=weights)
        return cls(ids, values, weights, temperature)

    @cached_property
    def total(self) -> float:
        """The weights' sum (only the post-sampling view needs it: the draw sums as it goes)."""
        return float(self.weights.sum(dtype=np.float64))

    @property
    def logits(self) -> np.ndarray:
        """The candidates' logits as the draw sees them (after the temperature)."""
        return scaled(self.values, self.temperature)

    @classmethod
    def single(cls, token: int, logit: float) -> Distribution:
        one = np.ones(1, dtype=np.float32)
        return cls(np.array([token]), np.array([logit], dtype=np.float32), one)

    @property
    def size(self) -> int:
        return int(self.weights.size)

    def token(self, position: int) -> int:
        return position if self.ids is None else int(self.ids[position])

    def draw(self, rng: LlamaRng) -> int:
        """llama.cpp's dist stage: one uniform number (drawn even for a single candidate, as llama.cpp
        does to keep its generator's state aligned), then the first candidate whose running mass reaches
        it, in the chain's order."""
        uniform = rng.uniform()
        return self.token(0 if self.size == 1 else weighted_pick(self.weights, uniform))

    def draw_discrete(self, rng: LlamaRng) -> int:
        """std::discrete_distribution's draw (mirostat's): no random number for a single candidate."""
        if self.size < 2:
            return self.token(0)
        return self.token(discrete_pick(self.weights, rng.uniform()))

    def top(self, k: int) -> list[tuple[int, float]]:
        """The k most probable candidates, best first, with their probabilities; zero-probability ones
        are left out (as llama-server does)."""
        if k <= 0:
            return []
        order = top_ids(self.weights, k)
        probs = self.weights[order].astype(np.float64) / self.total
        order, probs = order[probs > 0], probs[probs > 0]
        return [(self.token(int(i)), float(q)) for i, q in zip(order, probs, strict=True)]

    def prob(self, token: int) -> float:
        """The probability the draw gave `token` (0 when the chain had cut it)."""
        return self.weight_of(token) / self.total

    def weight_of(self, token: int) -> float:
        found, _ = positions_of(self.ids, self.size, np.array([token]))
        return float(self.weights[found[0]]) if found.size else 0.0
