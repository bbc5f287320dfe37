"""Drafts in the continuous batch: which generating sequences draft this step, and what became of it.

The scheduler hands over a step's chunks once decode tokens and prompt chunks are taken; `StepDrafts`
asks the policy how many tokens each drafting sequence may propose (its acceptance rate, the step's
measured cost), asks the chain for those drafts, lets the policy trim them to what pays, and sets
`seq.drafts`. After verification it drops the cells of refused tokens and tells the policy and the
speculator how the draft fared.
"""

from __future__ import annotations

from engine.embedding import EmbeddingSequence
from engine.sequence import Sequence
from engine.slots import Slot, SlotPool
from engine.speculative.base import Speculation
from engine.speculative.policy import DraftPolicy


class StepDrafts:
    def __init__(self, speculation: Speculation | None, pool: SlotPool) -> None:
        self.speculation = speculation
        self.pool = pool
        self.policy = DraftPolicy()  # which drafts a step verifies (their gain against the step's cost)

    def add(self, taken: list[tuple[Sequence | EmbeddingSequence, list[int]]], budget: int) -> None:
        """Drafts for the generating sequences among the step's (sequence, chunk) pairs, within `budget`
        tokens: first how many each may propose, then how many of each proposal are verified."""
        wanting = [(s, c) for s, c in taken if isinstance(s, Sequence) and s.drafting is not None]
        if self.speculation is None or not wanting:
            return
        explore = self.policy.explore()
        n_tokens = sum(len(chunk) for _, chunk in taken)
        n_emitting = sum(not seq.pending for seq, _ in taken if isinstance(seq, Sequence))
        rates = [self.policy.acceptance(seq.drafting.acceptance) for seq, _ in wanting if seq.drafting]
        lengths = [seq.draft_length(self._room(seq, chunk)) for seq, chunk in wanting]
        cheap = all(self.speculation.cheap(seq.drafting.params) for seq, _ in wanting if seq.drafting)
        caps = lengths if cheap else self.plan(n_tokens, n_emitting, rates, lengths, budget, explore)
        drafts = [self._propose(seq, chunk, cap) for (seq, chunk), cap in zip(wanting, caps, strict=True)]
        keep = [len(d) for d in drafts]
        if keep != caps or cheap:  # what of the proposals pays (the planned drafts, proposed whole, do)
            keep = self.plan(n_tokens, n_emitting, rates, keep, budget, explore)
        for (seq, _), draft, k in zip(wanting, drafts, keep, strict=True):
            n_min = seq.drafting.params.n_min if seq.drafting else 0
            seq.drafts = draft[:k] if k >= max(1, n_min) else []

    def plan(
        self,
        n_tokens: int,
        n_emitting: int,
        rates: list[float],
        lengths: list[int],
        budget: int,
        explore: bool,
    ) -> list[int]:
        if not any(lengths):
            return lengths
        return self.policy.plan(n_tokens, n_emitting, list(zip(rates, lengths, strict=True)), budget, explore)

    def settle(self, slot: Slot, seq: Sequence) -> None:
        """Drop the cells of refused draft tokens; tell the policy and the speculator how the draft fared."""
        if not seq.drafts or self.speculation is None or seq.drafting is None:
            return
        keep = len(slot.tokens) - len(seq.drafts) + seq.drafts_accepted
        del slot.tokens[keep:]
        self.pool.memory.truncate(slot.id, keep)
        history = slot.tokens[: keep - seq.drafts_accepted]
        key = seq.request.request_id
        self.policy.learn(seq.drafting.acceptance, len(seq.drafts), seq.drafts_accepted)
        self.speculation.accepted(seq.drafting.source, key, history, seq.drafts, seq.drafts_accepted)
        seq.drafts = []

    def forget(self, key: str) -> None:
        if self.speculation is not None:
            self.speculation.forget(key)

    def _room(self, seq: Sequence, chunk: list[int]) -> int:
        """Cells left for drafts after `chunk` (two kept free: the pick after the drafts, and one more)."""
        return self.pool.memory.n_ctx - len(self.pool[seq.slot_id].tokens) - len(chunk) - 2

    def _propose(self, seq: Sequence, chunk: list[int], n: int) -> list[int]:
        """The chain's draft of at most n tokens after `chunk` (a generating sequence's last token)."""
        if n <= 0 or self.speculation is None or seq.drafting is None:
            return []
        history = self.pool[seq.slot_id].tokens + chunk
        proposal = self.speculation.propose(seq.request.request_id, history, seq.drafting.params, n)
        if proposal is None:
            return []
        seq.drafting.source, draft = proposal
        return draft
