"""Which drafts a step verifies: each draft token's expected gain against what it adds to the step's time.

`StepCosts` learns what a step of T tokens costs from the engine's own steps (an EWMA per token count,
steps of decode and draft tokens only); `AcceptanceRate` learns from a sequence's verified drafts how
likely its next draft token is to be accepted; `DraftPolicy.plan` keeps the draft tokens that make the
step's expected tokens per second highest.

Why online and not a calibration at warm-up: the price of a draft token is the step's wall time, which
moves with the machine's load (this VM's cores are shared), the contexts' depth and the sampler's cost per
row (0.4-2 ms on Gemma 3's 262k vocabulary, more than a draft token's forward pass), and a warm-up pass
would add start-up time to every server. The engine measures the whole step (forward, sampling,
verification), so every one of those is in the price.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# Until two step sizes have been timed, drafts fill a step up to this many tokens (decode tokens first):
# the fixed cap this policy replaced (on this CPU a step of 16 tokens costs ~3.7-4.5x one of 1).
COLD_STEP_TOKENS = 17
ALPHA = 0.1  # EWMA weight of a new step time (the first few are averaged: alpha = max(ALPHA, 1/n))
DECAY = 0.9  # a sequence's acceptance forgets its older drafts at this rate per draft
PRIOR_WEIGHT = 2.0  # pseudo-trials a sequence's estimate gives the engine-wide rate
# Every EXPLORE_EVERY-th step verifies at least EXPLORE_TOKENS draft tokens (the best ones), priced or
# not: a table that once timed drafted steps during a load spike, or sequences that never got to draft,
# would otherwise never be measured again. At 16 streams on this CPU that costs ~0.3% of the steps' time.
EXPLORE_EVERY = 64
EXPLORE_TOKENS = 4
# The curve is refitted every REFIT_EVERY steps, not every step: refitting cost ~27 us a step, and an
# EWMA with ALPHA = 0.1 moves by a few percent in 8 steps.
REFIT_EVERY = 8
# Drafts are verified only when they promise this much more tokens/s than the step without them. The
# step-time table is an EWMA of a VM whose speed drifts by ±10% a minute, so a predicted gain of 1% is as
# likely a loss: Gemma 3 at 16 streams verified 168 draft tokens of a chat (156 accepted) for a predicted
# gain of at most a few percent and measured 0.91x (docs/performance-log.md). One stream's gains are 50-200%.
MIN_GAIN = 0.03


@dataclass
class StepCosts:
    """Seconds per step as a function of its token count: an EWMA per count seen, linear in between and
    extrapolated beyond with the least-squares slope of the counts seen (never negative)."""

    means: dict[int, float] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)
    _curve: tuple[np.ndarray, np.ndarray, float] | None = None  # (counts, seconds, slope)
    _stale: int = 0  # observations since the curve was fitted

    def observe(self, n_tokens: int, seconds: float) -> None:
        n = self.counts.get(n_tokens, 0) + 1
        self.counts[n_tokens] = n
        old = self.means.get(n_tokens, seconds)
        self.means[n_tokens] = old + max(ALPHA, 1.0 / n) * (seconds - old)
        self._stale += 1
        if n == 1 or self._stale >= REFIT_EVERY:  # a new size at once; a moved mean can wait a few steps
            self._curve = None

    @property
    def known(self) -> bool:
        """Two step sizes timed: enough for a slope."""
        return len(self.means) >= 2

    def estimate(self, n_tokens: np.ndarray) -> np.ndarray:
        """The expected seconds of steps of these token counts (requires `known`)."""
        xs, ys, slope = self._fit()
        t = np.asarray(n_tokens, dtype=np.float64)
        cost = np.interp(t, xs, ys)
        cost = np.where(t > xs[-1], ys[-1] + slope * (t - xs[-1]), cost)
        cost = np.where(t < xs[0], ys[0] - slope * (xs[0] - t), cost)
        return np.maximum(cost, 1e-6)

    def _fit(self) -> tuple[np.ndarray, np.ndarray, float]:
        """The sorted curve and its slope, computed once per step (plan asks twice)."""
        if self._curve is None:
            xs = np.array(sorted(self.means), dtype=np.float64)
            ys = np.array([self.means[int(x)] for x in xs])
            dx = xs - xs.mean()
            slope = max(0.0, float(dx @ (ys - ys.mean()) / (dx @ dx)))
            self._curve, self._stale = (xs, ys, slope), 0
        return self._curve


@dataclass
class AcceptanceRate:
    """P(a draft token is accepted | the ones before it were): every accepted token is a success and the
    first refused one a failure (those after it were never tested), with older drafts decaying."""

    hits: float = 0.0
    trials: float = 0.0

    def learn(self, n_drafted: int, n_accepted: int, decay: float = DECAY) -> None:
        self.hits = decay * self.hits + n_accepted
        self.trials = decay * self.trials + n_accepted + (n_accepted < n_drafted)

    def rate(self, prior: float, weight: float = PRIOR_WEIGHT) -> float:
        return (self.hits + weight * prior) / (self.trials + weight)


@dataclass
class DraftPolicy:
    """The engine's step costs and its pooled acceptance (the prior of a sequence that drafted little)."""

    costs: StepCosts = field(default_factory=StepCosts)
    pooled: AcceptanceRate = field(default_factory=AcceptanceRate)
    steps: int = 0

    def explore(self) -> bool:
        """Whether this step verifies a few drafts whatever their price (called once per step)."""
        self.steps += 1
        return self.steps % EXPLORE_EVERY == 0

    def acceptance(self, own: AcceptanceRate) -> float:
        return own.rate(self.pooled.rate(0.5))

    def learn(self, own: AcceptanceRate, n_drafted: int, n_accepted: int) -> None:
        own.learn(n_drafted, n_accepted)
        self.pooled.learn(n_drafted, n_accepted, decay=0.99)

    def plan(
        self,
        n_tokens: int,
        n_emitting: int,
        drafts: list[tuple[float, int]],
        budget: int,
        explore: bool = False,
    ) -> list[int]:
        """How many tokens of each draft to verify.

        `n_tokens`: the step's tokens without drafts; `n_emitting`: the sequences that emit a token from
        it; `drafts`: (acceptance rate a, length) per candidate draft, whose i-th token is accepted with
        probability ~a^i; `budget`: the most draft tokens that fit. Draft tokens are taken best first
        (a sequence's in order, since a^i falls with i), as many as make (n_emitting + expected accepted)
        / expected step time highest: none if that gains less than MIN_GAIN over no drafts. `explore`: at
        least the best EXPLORE_TOKENS, so their cost and acceptance are measured again.
        """
        rates = np.array([a for a, _ in drafts], dtype=np.float64)
        lengths = np.array([n for _, n in drafts], dtype=np.int64)
        if not lengths.sum():
            return [0] * len(drafts)
        owner = np.repeat(np.arange(len(drafts)), lengths)
        position = np.arange(len(owner)) - np.repeat(np.cumsum(lengths) - lengths, lengths) + 1
        flat = rates[owner] ** position  # P(the draft token at this position is accepted)
        order = np.argsort(-flat, kind="stable")[:budget]
        if not self.costs.known:
            k = max(0, min(len(order), COLD_STEP_TOKENS - n_tokens))
        else:
            expected = n_emitting + np.concatenate(([0.0], np.cumsum(flat[order])))
            seconds = self.costs.estimate(n_tokens + np.arange(len(order) + 1))
            speed = expected / seconds
            k = int(np.argmax(speed))  # ties: the fewest draft tokens
            k = k if speed[k] >= (1 + MIN_GAIN) * speed[0] else 0
        if explore:
            k = max(k, min(len(order), EXPLORE_TOKENS))
        return np.bincount(owner[order[:k]], minlength=len(drafts)).tolist()
