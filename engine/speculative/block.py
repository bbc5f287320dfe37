"""Block drafters: a draft head proposes a whole block of tokens from the target's own features.

MTP, EAGLE3 and DFlash/DSpark heads are trained weights that no package here ships. This is where one
plugs in: subclass `BlockDrafter`, implement `propose_block` (its `features` are the target's last hidden
state for the sequence once the model returns them; None until then), and register the class under its
llama-server --spec-type name in engine/speculative/setup.py. DSpark's anchor-first block with a Markov
bias is a `propose_block` that drafts the anchor from the features and the rest from the anchor.
Verification, acceptance, cache truncation and stats are the engine's, as for every speculator.

`ReplayDrafter` is the synthetic block drafter the tests verify that path with: it replays a known
continuation of a known prompt (optionally spoiling some of its tokens), so its acceptance is known.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.speculative.base import SpecParams, Speculator


class BlockDrafter(Speculator):
    """A speculator that drafts a block at once from target features."""

    def propose(self, key: str, history: Sequence[int], params: SpecParams, n: int) -> list[int]:
        return self.propose_block(key, history, None, n)

    def propose_block(
        self, key: str, history: Sequence[int], features: np.ndarray | None, n: int
    ) -> list[int]:
        raise NotImplementedError


class ReplayDrafter(BlockDrafter):
    """Replays `continuation` after `prompt`; every `spoil_every`-th drafted token is replaced by another
    token (a drafter that is sometimes wrong), so acceptance is below 100% in a known way."""

    name = "replay"

    def __init__(self, prompt: Sequence[int], continuation: Sequence[int], spoil_every: int = 0) -> None:
        self.prompt = list(prompt)
        self.continuation = list(continuation)
        self.spoil_every = spoil_every

    def propose_block(
        self, key: str, history: Sequence[int], features: np.ndarray | None, n: int
    ) -> list[int]:
        known = self.prompt + self.continuation
        if list(history) != known[: len(history)] or len(history) < len(self.prompt):
            return []
        block = known[len(history) : len(history) + n]
        if self.spoil_every:
            block = [t + 1 if (len(history) + i) % self.spoil_every == 0 else t for i, t in enumerate(block)]
        return block
