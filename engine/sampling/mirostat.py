"""Mirostat 1 and 2 (llama.cpp's `mirostat`, `mirostat-v2`): a target surprise tau, learned through mu.

Both cut the (temperature-scaled) vocabulary by what mu allows, draw with std::discrete_distribution and
move mu by eta times the draw's surprise error, in float32 as llama.cpp does. llama.cpp sorts the whole
vocabulary first; this cuts first and sorts only what is kept (v1 needs the best 100 for its Zipf
estimate, v2 a probability threshold), so it costs a few O(n) passes on a 262k vocabulary. The
softmax's float32 sum then runs in id order rather than llama.cpp's sorted order, which can move a
candidate sitting exactly on the cut.
"""

from __future__ import annotations

import numpy as np

from engine.sampling.arrays import best_first, softmax32, top_ids
from engine.sampling.distribution import Distribution
from engine.sampling.stages import Candidates

_M = 100  # llama.cpp's common_sampler_init passes m = 100 to mirostat 1
_F32 = np.float32


class Mirostat:
    def __init__(self, version: int, tau: float, eta: float, n_vocab: int) -> None:
        self.version = version
        self.tau = _F32(tau)
        self.eta = _F32(eta)
        self.n_vocab = n_vocab
        self.mu = _F32(2) * self.tau

    def distribution(self, c: Candidates) -> Distribution:
        """What this step draws from: the candidates mu keeps, best first, with float32 probabilities."""
        kept = self._keep_v1(c) if self.version == 1 else self._keep_v2(c)
        c.keep(kept, True)
        probs = softmax32(c.logits)
        return Distribution(c.ids, c.logits, probs)

    def learn(self, dist: Distribution, token: int) -> None:
        """Move mu by the drawn token's surprise (-log2 p) against tau."""
        with np.errstate(divide="ignore"):
            surprise = -np.log2(_F32(dist.weight_of(token)))
        self.mu = _F32(self.mu - self.eta * (surprise - self.tau))

    def _keep_v1(self, c: Candidates) -> np.ndarray:
        """Estimate the Zipf exponent s from the best m probabilities, then keep the k that mu asks for."""
        best = top_ids(c.logits, _M)
        probs = softmax32(c.logits)[best]
        n = min(_M - 1, best.size - 1)
        steps = np.arange(n, dtype=np.float32)
        t = np.log((steps + _F32(2)) / (steps + _F32(1)))
        with np.errstate(divide="ignore", invalid="ignore"):
            b = np.log(probs[:n] / probs[1 : n + 1])
            s_hat = np.cumsum(t * b)[-1] / np.cumsum(t * t)[-1] if n > 0 else _F32(np.nan)
            epsilon = s_hat - _F32(1)
            scale = (epsilon * np.power(_F32(2), self.mu)) / (
                _F32(1) - np.power(_F32(self.n_vocab), -epsilon)
            )
            k = np.power(scale, _F32(1) / s_hat)
        # C's int(k) of NaN, an infinity or an overflow is INT_MIN on x86, which max(., 1) turns into 1.
        count = int(k) if np.isfinite(k) and abs(k) < 2**31 else 1
        count = min(max(count, 1), c.size)
        return top_ids(c.logits, count) if count < c.size else best_first(c.logits)

    def _keep_v2(self, c: Candidates) -> np.ndarray:
        """Keep the candidates whose surprise -log2 p is at most mu (at least the best one)."""
        with np.errstate(divide="ignore"):
            kept = np.flatnonzero(-np.log2(softmax32(c.logits)) <= self.mu)
        if not kept.size:
            return top_ids(c.logits, 1)
        return kept[best_first(c.logits[kept])]
