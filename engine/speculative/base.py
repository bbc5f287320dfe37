"""The speculator interface, a request's speculation settings, and the chain of speculators."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

# llama-server's --spec-type values built here ("none" is the default: no speculation).
SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-cache", "draft-simple")
MAX_DRAFT = 128  # a draft longer than this only wastes the batch


@dataclass(frozen=True)
class SpecParams:
    """How one request speculates (llama-server's --spec-* / --draft-* flags, `speculative.*` fields)."""

    types: tuple[str, ...] = ()  # empty: no speculation
    n_max: int = 16  # most tokens drafted per step
    n_min: int = 0  # a shorter proposal is not worth verifying
    p_min: float = 0.75  # a draft model stops drafting below this probability of its own pick
    ngram_n: int = 12  # length of the n-gram looked up in the history
    ngram_m: int = 48  # length of the m-gram drafted after it
    min_hits: int = 1  # ngram-map-k: how often a key must have been followed by its m-gram

    def __post_init__(self) -> None:
        # Type names are checked where they come in (the command line, a request): an engine may carry
        # extra speculators (block drafters) under their own names.
        if not 0 <= self.n_min <= self.n_max <= MAX_DRAFT:
            raise ValueError(f"speculative n_min/n_max must satisfy 0 <= n_min <= n_max <= {MAX_DRAFT}")
        if not 0.0 <= self.p_min <= 1.0:
            raise ValueError("speculative p_min must be in [0, 1]")
        if self.ngram_n < 1 or self.ngram_m < 1 or self.min_hits < 1:
            raise ValueError("speculative n-gram sizes and min hits must be >= 1")

    @property
    def enabled(self) -> bool:
        return bool(self.types) and self.n_max > 0


class Speculator(ABC):
    """Proposes tokens that may follow a sequence; learns from what the target accepted.

    `key` names the sequence (its request id) for speculators that keep per-sequence state; `history`
    is every token of the sequence so far, the last sampled one included.
    """

    name: str = ""
    # Proposing costs microseconds (a lookup), so a step drafts first and prices what came back; a
    # costly speculator (a model's forward passes) is priced first and asked for no more than pays.
    cheap: bool = False

    @abstractmethod
    def propose(self, key: str, history: Sequence[int], params: SpecParams, n: int) -> list[int]:
        """At most n tokens to verify after `history` (none: nothing worth trying)."""

    def accepted(self, key: str, history: Sequence[int], proposed: list[int], n_accepted: int) -> None:  # noqa: B027
        """The target accepted the first `n_accepted` of `proposed` (after `history`); no-op by default."""

    def forget(self, key: str) -> None:  # noqa: B027
        """The sequence ended; no-op by default."""


@dataclass
class SpeculatorStats:
    """llama-server's per-implementation statistics."""

    calls: int = 0
    drafts: int = 0
    proposed: int = 0
    accepted: int = 0

    @property
    def expected_acceptance(self) -> float:
        """Laplace-smoothed share of proposed tokens accepted: untried speculators get their turn."""
        return (self.accepted + 1) / (self.proposed + 2)


@dataclass
class Speculation:
    """The engine's speculators (a chain: the one with the best acceptance so far proposes first)."""

    speculators: dict[str, Speculator]
    stats: dict[str, SpeculatorStats] = field(default_factory=dict)

    def propose(
        self, key: str, history: Sequence[int], params: SpecParams, n: int
    ) -> tuple[str, list[int]] | None:
        """(speculator name, draft) of the first speculator in order that proposes at least n_min tokens."""
        usable = [t for t in params.types if t in self.speculators]
        for name in sorted(usable, key=lambda t: -self._stats(t).expected_acceptance):
            stats = self._stats(name)
            stats.calls += 1
            draft = self.speculators[name].propose(key, history, params, n)[:n]
            if draft and len(draft) >= max(params.n_min, 1):
                return name, draft
        return None

    def cheap(self, params: SpecParams) -> bool:
        """Every speculator these settings may ask is cheap (Speculator.cheap)."""
        return all(self.speculators[t].cheap for t in params.types if t in self.speculators)

    def accepted(
        self, name: str, key: str, history: Sequence[int], draft: list[int], n_accepted: int
    ) -> None:
        stats = self._stats(name)  # counted once verified: the draft policy may verify only part of it
        stats.drafts += 1
        stats.proposed += len(draft)
        stats.accepted += n_accepted
        self.speculators[name].accepted(key, history, draft, n_accepted)

    def forget(self, key: str) -> None:
        for speculator in self.speculators.values():
            speculator.forget(key)

    def _stats(self, name: str) -> SpeculatorStats:
        return self.stats.setdefault(name, SpeculatorStats())
