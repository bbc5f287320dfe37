"""Speculative decoding: speculators propose a few tokens, the target model checks them in one pass.

A `Speculator` proposes up to n tokens that may follow a sequence's history and learns how many were
accepted. `Speculation` is the engine's set of them (llama-server's `--spec-type` chain): per step the
one with the best acceptance so far proposes. The scheduler puts the proposal after the sequence's
last token in the same batch as everything else (`BatchPart(want_logits="all")`); the sequence then
advances through the rows, each pick made with the draft token in hand (engine/sampling.py keeps the
output distribution exactly the target's; greedy picks are unchanged), and the cells of refused tokens
are dropped by truncation. Which drafts a step verifies is the policy's (policy.py): a draft token is
kept while its expected gain (the sequence's acceptance rate a, the i-th token ~a^i) beats what it adds
to the step's measured time, so with many sequences decoding drafts mostly stop.

Modules: ngram (ngram-simple, ngram-map-k, ngram-cache), draft (draft-simple: a small model with
its own KV cache), block (block drafters: the interface MTP / EAGLE3 / DFlash heads plug into, and a
replaying drafter for tests), policy (the cost-aware choice of drafts).
"""

from __future__ import annotations

from engine.speculative.base import SPEC_TYPES, SpecParams, Speculation, Speculator

__all__ = ["SPEC_TYPES", "SpecParams", "Speculation", "Speculator"]
