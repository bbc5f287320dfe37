"""Adaptive-p (llama.cpp's `adaptive-p`, src/llama-sampler.cpp): draw tokens whose probability averages
a target, learned through a moving average of the drawn tokens' probabilities.

It ends the chain instead of the draw (common_sampler_init appends it when `samplers` names it). Each
step: the chain's candidates get their softmax (the *original* probabilities); the target for this step
is clamp(2 * target - average, 0, 1), where the average is an exponential moving average of the original
probabilities of the tokens drawn so far (seeded as if `target` had been drawn forever); every finite
logit becomes

    PEAK - SHARPNESS * d^2 / (1 + d),   d = |p - adapted target| / WIDTH

(quadratic near the target, linear far from it), and the token is drawn from their softmax with
std::discrete_distribution (llama_sample_dist). Accepting the drawn token then moves the average by its
original probability. With a negative target it draws from the original softmax, also with
std::discrete_distribution. Everything is float32, in llama.cpp's order of operations, and the
candidates stay in the chain's order, so a seeded request draws what llama.cpp draws.
"""

from __future__ import annotations

import numpy as np

from engine.sampling.arrays import positions_of, softmax32
from engine.sampling.distribution import Distribution

_F32 = np.float32
WIDTH = _F32(0.3)  # DISTRIBUTION_WIDTH
INV_WIDTH = _F32(1) / WIDTH
PEAK = _F32(5.0)  # PEAK_LOGIT_VALUE
SHARPNESS = _F32(10.0)
_MAX_DECAY = _F32(0.99)


def clamp(x: np.float32, low: np.float32, high: np.float32) -> np.float32:
    """std::clamp (a NaN passes through, as there)."""
    return low if x < low else high if high < x else x


def transform(probs: np.ndarray, logits: np.ndarray, adapted: np.float32) -> np.ndarray:
    """The adaptive logits (float32, a fresh array): the transform of each probability; -inf logits
    (masked candidates) stay -inf."""
    distance = np.abs((probs - adapted) * INV_WIDTH)
    out = PEAK - SHARPNESS * distance * distance / (_F32(1) + distance)
    out[logits == -np.inf] = -np.inf
    return out


class AdaptiveP:
    """One sequence's adaptive-p state: the moving average and the drawn token awaiting acceptance."""

    def __init__(self, target: float, decay: float) -> None:
        self.target = _F32(target)
        self.decay = clamp(_F32(decay), _F32(0), _MAX_DECAY)
        with np.errstate(over="ignore"):
            self.weighted_sum = self.target / (_F32(1) - self.decay)  # sum(p_i * decay^i)
            self.total_weight = _F32(1) / (_F32(1) - self.decay)  # sum(decay^i)
        self._probs: np.ndarray | None = None  # the last step's original probabilities
        self._ids: np.ndarray | None = None
        self._pending: tuple[int, np.float32] | None = None  # drawn, not yet accepted

    @property
    def enabled(self) -> bool:
        return bool(self.target >= 0)

    def adapted_target(self) -> np.float32:
        """This step's target: clamp(2 * target - average, 0, 1), the target clamped first."""
        target = clamp(self.target, _F32(0), _F32(1))
        if self.total_weight == 0:
            return target
        return clamp(_F32(2) * target - self.weighted_sum / self.total_weight, _F32(0), _F32(1))

    def distribution(self, ids: np.ndarray | None, logits: np.ndarray) -> Distribution:
        """What this step draws from: the candidates in the chain's order (`ids` None: every token in id
        order), their adaptive logits and probabilities (the draw's weights). `logits` is not changed."""
        probs = softmax32(logits)
        if not self.enabled:
            self._probs = None
            return Distribution(ids, logits, probs)
        self._probs, self._ids = probs, ids
        adaptive = transform(probs, logits, self.adapted_target())
        return Distribution(ids, adaptive, softmax32(adaptive))

    def drawn(self, token: int) -> None:
        """The last `distribution` drew `token`: keep its original probability for `accept`."""
        if self._probs is None:
            self._pending = None
            return
        found, _ = positions_of(self._ids, self._probs.size, np.array([token]))
        self._pending = (token, self._probs[found[0]]) if found.size else None

    def accept(self, token: int) -> None:
        """A token joins the sequence: the drawn one moves the average by its original probability
        (a prompt or forced token leaves it alone); the pending draw is cleared either way."""
        if self._pending is not None and self._pending[0] == token:
            with np.errstate(over="ignore", invalid="ignore"):
                self.weighted_sum = _F32(self._pending[1] + self.decay * self.weighted_sum)
                self.total_weight = _F32(_F32(1) + self.decay * self.total_weight)
        self._pending = None
