"""One forward step's worth of tokens: prefill chunks and decode tokens of several sequences, mixed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Batch:
    tokens: np.ndarray  # int32 [T]
    positions: np.ndarray  # int32 [T]: position of each token in its sequence (= its KV cache cell)
    seq_ids: np.ndarray  # int32 [T]: the KV cache sequence (slot) each token belongs to
    output_rows: np.ndarray  # int32 [n_out]: the rows of T whose logits the caller wants

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if not (len(self.positions) == len(self.seq_ids) == n):
            raise ValueError("tokens, positions and seq_ids must have the same length")

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @classmethod
    def from_sequences(cls, parts: Sequence[tuple[int, int, Sequence[int], bool]]) -> Batch:
        """Build a batch from (seq_id, start_position, tokens, want_all_logits) parts.

        Each part contributes its tokens at consecutive positions; its last token's logits are always
        returned, every token's when want_all_logits (teacher forcing, perplexity).
        """
        tokens, positions, seq_ids, outputs = [], [], [], []
        for seq_id, start, toks, want_all in parts:
            base = len(tokens)
            tokens.extend(toks)
            positions.extend(range(start, start + len(toks)))
            seq_ids.extend([seq_id] * len(toks))
            outputs.extend(range(base, base + len(toks)) if want_all else [base + len(toks) - 1])
        return cls(
            np.asarray(tokens, dtype=np.int32),
            np.asarray(positions, dtype=np.int32),
            np.asarray(seq_ids, dtype=np.int32),
            np.asarray(outputs, dtype=np.int32),
        )
