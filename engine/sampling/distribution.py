"""`Distribution`: what a sampler chain leaves to draw from, and llama-server's post-sampling view of it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.sampling.arrays import discrete_pick, dist_weights, positions_of, top_ids, weighted_pick
from engine.sampling.rng import LlamaRng


@dataclass
class Distribution:
    """The candidates at the end of the chain, in the chain's order, and their draw weights.

    `ids` None: every token, in id order. `weights` are exp(logit - max) in float32 (0 for a banned
    token), the probabilities once divided by `total`.
    """

    ids: np.ndarray | None
    logits: np.ndarray
    weights: np.ndarray
    total: float

    @classmethod
    def of(cls, ids: np.ndarray | None, logits: np.ndarray) -> Distribution:
        weights = dist_weights(logits)
        return cls(ids, logits, weights, float(weights.sum(dtype=np.float64)))

    @classmethod
    def single(cls, token: int, logit: float) -> Distribution:
        one = np.ones(1, dtype=np.float32)
        return cls(np.array([token]), np.array([logit], dtype=np.float32), one, 1.0)

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
