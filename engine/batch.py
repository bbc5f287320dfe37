"""One forward step's worth of tokens: prefill chunks and decode tokens of several sequences, mixed."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
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
    def of(cls, parts: Iterable[BatchPart]) -> Batch:
        """The parts' tokens one after another; output rows in part order, as each part wants them."""
        tokens: list[int] = []
        positions: list[int] = []
        seq_ids: list[int] = []
        outputs: list[int] = []
        for part in parts:
            base, n = len(tokens), len(part.tokens)
            tokens.extend(part.tokens)
            positions.extend(range(part.start, part.start + n))
            seq_ids.extend([part.seq_id] * n)
            if part.want_logits == "all":
                outputs.extend(range(base, base + n))
            elif part.want_logits == "last":
                outputs.append(base + n - 1)
        return cls(
            np.asarray(tokens, dtype=np.int32),
            np.asarray(positions, dtype=np.int32),
            np.asarray(seq_ids, dtype=np.int32),
            np.asarray(outputs, dtype=np.int32),
        )
