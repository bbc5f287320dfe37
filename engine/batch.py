"""One forward step's worth of tokens: prefill chunks and decode tokens of several sequences, mixed."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

# Which logits a part wants back: its last token's (the next-token distribution), every token's
# (teacher forcing, perplexity), or none (a prompt chunk with more of the prompt still to come).
WantLogits = Literal["last", "all", "none"]


@dataclass(frozen=True)
class BatchPart:
    """`tokens` of sequence `seq_id` at consecutive positions from `start`."""

    seq_id: int
    start: int
    tokens: Sequence[int]
    want_logits: WantLogits = "last"
    # Every token's final hidden state (after the output norm) instead of logits: embeddings and rerank
    # pool these (engine/embedding.py).
    want_hidden: bool = False


@dataclass(frozen=True)
class Batch:
    tokens: np.ndarray  # int32 [T]
    positions: np.ndarray  # int32 [T]: position of each token in its sequence (= its KV cache cell)
    seq_ids: np.ndarray  # int32 [T]: the KV cache sequence (slot) each token belongs to
    output_rows: np.ndarray  # int32 [n_out]: the rows of T whose logits the caller wants
    # int32 [n_hidden]: the rows of T whose final hidden states (after the output norm) the caller wants
    hidden_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if not (len(self.positions) == len(self.seq_ids) == n):
            raise ValueError("tokens, positions and seq_ids must have the same length")

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @classmethod
    def of(cls, parts: Iterable[BatchPart]) -> Batch:
        """The parts' tokens one after another; output rows in part order, as each part wants them."""
        tokens: list[int] = []
        positions: list[int] = []
        seq_ids: list[int] = []
        outputs: list[int] = []
        hidden: list[int] = []
        for part in parts:
            base, n = len(tokens), len(part.tokens)
            tokens.extend(part.tokens)
            positions.extend(range(part.start, part.start + n))
            seq_ids.extend([part.seq_id] * n)
            if part.want_logits == "all":
                outputs.extend(range(base, base + n))
            elif part.want_logits == "last":
                outputs.append(base + n - 1)
            if part.want_hidden:
                hidden.extend(range(base, base + n))
        return cls(
            np.asarray(tokens, dtype=np.int32),
            np.asarray(positions, dtype=np.int32),
            np.asarray(seq_ids, dtype=np.int32),
            np.asarray(outputs, dtype=np.int32),
            np.asarray(hidden, dtype=np.int32),
        )
