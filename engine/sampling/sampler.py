"""`Sampler`: one sequence's sampler chain (llama.cpp's common_sampler): bias, the stages, a seeded draw.

The default chain's stages in their default order take a vectorised fast path (engine/sampling/
default_chain.py); any other chain runs stage by stage (engine/sampling/stages.py), and mirostat has its
own (engine/sampling/mirostat.py). Adaptive-p, when `samplers` names it, replaces the draw at the end of
either path (engine/sampling/adaptive_p.py). The random numbers are llama.cpp's (engine/sampling/rng.py),
drawn in llama.cpp's candidate order, so a seeded request picks the tokens llama.cpp would from the same
logits (floating-point rounding aside).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from functools import partial

import numpy as np

from engine.sampling import default_chain, stages
from engine.sampling.adaptive_p import AdaptiveP
from engine.sampling.arrays import logsumexp, scaled, top_ids
from engine.sampling.distribution import Distribution
from engine.sampling.dry import Breakers, Dry
from engine.sampling.mirostat import Mirostat
from engine.sampling.params import SamplingParams
from engine.sampling.penalties import PenaltyWindow
from engine.sampling.rng import LlamaRng
from engine.sampling.stages import Candidates

Stage = Callable[[Candidates], None]


class Sampler:
    """One per sequence: owns its random generators, penalty and DRY histories, mirostat's and
    adaptive-p's state. Not thread-safe (one engine thread). `breakers` (engine/sampling/dry.py) is
    needed when DRY is on."""

    def __init__(self, params: SamplingParams, n_vocab: int, breakers: Breakers | None = None) -> None:
        self.params = params
        self.n_vocab = n_vocab
        # The seed actually used, so a random one can still be reported (llama-server returns it).
        self.seed: int = secrets.randbits(32) if params.random_seed else params.seed
        # llama.cpp gives each stochastic stage its own generator, all seeded alike.
        self._rng = LlamaRng(self.seed)
        self._xtc_rng = LlamaRng(self.seed)
        self._bias_ids, self._bias_values = _bias_arrays(params.logit_bias, n_vocab)
        self._penalties = PenaltyWindow(params)
        chain = params.chain()
        self._chain = chain
        self._fast = default_chain.takes_fast_path(params)
        self._fast_greedy = self._fast and params.greedy
        self._dry: Dry | None = None
        if "dry" in chain:
            if breakers is None and params.dry_sequence_breakers:
                raise ValueError("DRY's sequence breakers need the model's vocabulary")
            self._dry = Dry(params, breakers or Breakers({}))
        self._mirostat: Mirostat | None = None
        if params.mirostat:
            self._mirostat = Mirostat(params.mirostat, params.mirostat_tau, params.mirostat_eta, n_vocab)
        self._adaptive: AdaptiveP | None = None
        if params.adaptive_p:
            self._adaptive = AdaptiveP(params.adaptive_target, params.adaptive_decay)
        self._stages = [self._stage(name) for name in chain]
        self.last: Distribution | None = None  # what the last sample() drew from

    def accept(self, token: int) -> None:
        """Record a prompt or generated token in the penalty and DRY windows (the caller accepts the
        sampled one); adaptive-p learns from the token it drew when that one is accepted."""
        self._penalties.accept(token)
        if self._dry is not None:
            self._dry.accept(token)
        if self._adaptive is not None:
            self._adaptive.accept(token)

    def sample(self, logits: np.ndarray, draft: int | None = None) -> int:
        """Pick the next token; `logits` (float32 [n_vocab]) is not modified.

        With a `draft` token (speculative decoding) the pick is drawn exactly as without one, and the
        caller accepts the draft when they agree: llama.cpp's verification (sample, compare), which keeps
        the chain's distribution (P(accept) = p(draft)) and gives a seeded request the same tokens with or
        without speculation. `last` keeps the distribution drawn from (post-sampling probabilities).
        """
        del draft  # the draw does not depend on it (see above)
        dist = self.distribution(logits)
        if self._mirostat is not None:
            token = dist.draw_discrete(self._rng)
            self._mirostat.learn(dist, token)
        elif self._fast_greedy:
            token = dist.token(0)
        elif self._adaptive is not None:
            token = dist.draw_discrete(self._rng)  # llama_sample_dist: std::discrete_distribution
            self._adaptive.drawn(token)
        else:
            token = dist.draw(self._rng)
        self.last = dist
        return token

    def distribution(self, logits: np.ndarray) -> Distribution:
        """The chain up to the draw: what is left to draw from. Stochastic stages (XTC) use their
        random numbers here, so each call is one step of the chain."""
        self._check(logits)
        work = self.adjust(logits) if self._fast else self._biased(logits)
        best = int(np.argmax(work))  # first maximum: lowest id wins ties
        if not np.isfinite(work[best]) or self._fast_greedy:
            # All-banned logits (max -inf) have no distribution; the lowest id is a defined answer.
            return Distribution.single(best, float(work[best]))
        if self._fast:
            ids, values, temperature = self._fast_candidates(work)
            if self._adaptive is not None:
                return self._adaptive.distribution(ids, scaled(values, temperature))
            return Distribution.of(ids, values, temperature)
        c = Candidates(None, work)
        if self._mirostat is not None:
            stages.plain_temperature(c, self.params.temperature)
            return self._mirostat.distribution(c)
        for stage in self._stages:
            stage(c)
        if self._adaptive is not None:
            return self._adaptive.distribution(c.ids, c.logits)
        return Distribution.of(c.ids, c.logits)

    def post_sampling_probs(self, logits: np.ndarray, k: int) -> list[tuple[int, float]]:
        """The k most probable candidates after the chain (one step of it: see `distribution`)."""
        return self.distribution(logits).top(k)

    def adjust(self, logits: np.ndarray) -> np.ndarray:
        """The logits after the bias and penalty stages: a copy, or the input itself when neither applies."""
        self._check(logits)
        penalise = self._penalties.active
        if not self._bias_ids.size and not penalise:
            return logits
        work = self._biased(logits)
        if penalise:
            self._penalties.apply(work)
        return work

    def top_logprobs(self, logits: np.ndarray, k: int) -> list[tuple[int, float]]:
        """The k most likely tokens of the raw distribution, best first (ties: lowest id), with log-probs.

        llama-server reports probabilities of the unmodified logits (no bias, penalties, truncation or
        temperature) unless a request asks for post-sampling probabilities.
        """
        self._check(logits)
        k = min(k, logits.size)
        if k <= 0:
            return []
        ids = top_ids(logits, k)
        lse = logsumexp(logits)
        return [(int(i), float(logits[i]) - lse) for i in ids]

    def token_logprob(self, logits: np.ndarray, token: int) -> float:
        """Log-probability of `token` under the raw distribution (what llama-server reports per token)."""
        self._check(logits)
        return float(logits[token]) - logsumexp(logits)

    # -- the chain ---------------------------------------------------------------------------------------

    def _check(self, logits: np.ndarray) -> None:
        if logits.shape != (self.n_vocab,):
            raise ValueError(f"expected logits of shape ({self.n_vocab},), got {logits.shape}")

    def _biased(self, logits: np.ndarray) -> np.ndarray:
        work = logits.astype(np.float32, copy=True)
        if self._bias_ids.size:
            work[self._bias_ids] += self._bias_values
        return work

    def _fast_candidates(self, work: np.ndarray) -> tuple[np.ndarray | None, np.ndarray, float]:
        """The fast path's candidates (ids, logits before the temperature) and the temperature."""
        p, chain = self.params, self._chain
        ids, values = default_chain.candidates(
            work,
            p.top_k if "top_k" in chain else 0,
            p.top_p if "top_p" in chain else 1.0,
            p.min_p if "min_p" in chain else 0.0,
        )
        return ids, values, p.temperature if "temperature" in chain else 1.0

    def _stage(self, name: str) -> Stage:
        p = self.params
        table: dict[str, Stage] = {
            "penalties": self._penalize,
            "dry": self._dry_penalize,
            "top_n_sigma": partial(stages.top_n_sigma, n=p.top_n_sigma),
            "top_k": partial(stages.top_k, k=p.top_k),
            "typ_p": partial(stages.typical, p=p.typical_p, min_keep=p.min_keep),
            "top_p": partial(stages.top_p, p=p.top_p, min_keep=p.min_keep),
            "min_p": partial(stages.min_p, p=p.min_p, min_keep=p.min_keep),
            "xtc": partial(
                stages.xtc,
                probability=p.xtc_probability,
                threshold=p.xtc_threshold,
                min_keep=p.min_keep,
                rng=self._xtc_rng,
            ),
            "temperature": partial(
                stages.temperature, temp=p.temperature, delta=p.dynatemp_range, exponent=p.dynatemp_exponent
            ),
        }
        return table[name]

    def _penalize(self, c: Candidates) -> None:
        if self._penalties.active:
            tokens, amounts = self._penalties.amounts()
            c.adjust(tokens, amounts, scale=self.params.repeat_penalty)

    def _dry_penalize(self, c: Candidates) -> None:
        found = self._dry.penalties() if self._dry is not None else None
        if found is not None:
            c.adjust(*found)


def _bias_arrays(bias: dict[int, float], n_vocab: int) -> tuple[np.ndarray, np.ndarray]:
    # llama-server silently drops biases for ids outside the vocabulary.
    items = [(int(t), float(b)) for t, b in bias.items() if 0 <= int(t) < n_vocab]
    ids = np.array([t for t, _ in items], dtype=np.int64)
    values = np.array([b for _, b in items], dtype=np.float32)
    return ids, values
