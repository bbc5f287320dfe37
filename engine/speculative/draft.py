"""`draft-simple`: a small model with the target's vocabulary drafts greedily (`-md/--model-draft`).

The draft model keeps its own KV cache, one sequence per target slot, in lockstep with the target by
prefix: each proposal keeps the cells whose tokens still match the sequence's history (what the
target accepted), feeds the rest, then drafts one token per forward pass while its own pick is at
least `p_min` likely (llama.cpp's --draft-p-min). Drafting runs on the engine thread, between steps.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.llm import LLM
from engine.memory.prompt_cache import common_prefix
from engine.speculative.base import SpecParams, Speculator


class DraftModelError(ValueError):
    """A draft model that cannot draft for this target (another vocabulary)."""


def check_vocabulary(draft: LLM, target: LLM) -> None:
    """Refuse a draft whose token ids mean other text than the target's (it could never be accepted)."""
    a, b = draft.tokenizer, target.tokenizer
    if a.n_vocab != b.n_vocab or any(a.token_to_piece(t) != b.token_to_piece(t) for t in range(a.n_vocab)):
        raise DraftModelError(
            f"the draft model {draft.path.name} has another vocabulary than {target.path.name}"
            f" ({a.n_vocab} vs {b.n_vocab} tokens, or different token texts)"
        )


class DraftModel(Speculator):
    name = "draft-simple"

    def __init__(self, llm: LLM, n_seq: int, n_ctx: int) -> None:
        self.llm = llm
        self.kv = llm.new_cache(n_seq, n_ctx)
        self._cached: list[list[int]] = [[] for _ in range(n_seq)]  # what each sequence's cells hold
        self._slots: dict[str, int] = {}

    def propose(self, key: str, history: Sequence[int], params: SpecParams, n: int) -> list[int]:
        slot = self._slot(key)
        if slot is None or len(history) + n >= self.kv.n_ctx:
            return []
        logits = self._catch_up(slot, history)
        draft: list[int] = []
        while True:
            token, p = _best(logits)
            if p < params.p_min:
                break
            draft.append(token)
            if len(draft) == n:
                break
            logits = self._feed(slot, [token])
        return draft

    def forget(self, key: str) -> None:
        slot = self._slots.pop(key, None)
        if slot is not None:
            self._cached[slot] = []
            self.kv.clear(slot)

    def _slot(self, key: str) -> int | None:
        if key not in self._slots:
            free = set(range(self.kv.n_seq)) - set(self._slots.values())
            if not free:
                return None
            self._slots[key] = min(free)
        return self._slots[key]

    def _catch_up(self, slot: int, history: Sequence[int]) -> np.ndarray:
        """Keep the cells that still match `history`, feed the rest: the logits after its last token."""
        keep = min(common_prefix(self._cached[slot], list(history)), len(history) - 1)
        self.kv.truncate(slot, keep)
        del self._cached[slot][keep:]
        return self._feed(slot, list(history[keep:]))

    def _feed(self, slot: int, tokens: list[int]) -> np.ndarray:
        logits = self.llm.prefill(self.kv, slot, tokens)
        self._cached[slot].extend(tokens)
        return logits


def _best(logits: np.ndarray) -> tuple[int, float]:
    """The draft's greedy pick and its probability."""
    token = int(np.argmax(logits))
    shifted = logits - logits[token]
    return token, float(1.0 / np.exp(shifted, dtype=np.float64).sum())
