"""One forward step's worth of tokens: prefill chunks and decode tokens of several sequences, mixed."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from engine.media.chunks import PartMedia

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
    media: PartMedia | None = None  # its rows that take a medium's embeddings instead of a token's
    lora: tuple[tuple[int, float], ...] = ()  # the LoRA adapters its rows run under (engine/lora.py)
    lora_from: int = 0  # ... its rows at this position and after (an aLoRA's activation); those before: none


@dataclass(frozen=True)
class Batch:
    tokens: np.ndarray  # int32 [T]
    positions: np.ndarray  # int32 [T]: position of each token in its sequence (= its KV cache cell)
    seq_ids: np.ndarray  # int32 [T]: the KV cache sequence (slot) each token belongs to
    output_rows: np.ndarray  # int32 [n_out]: the rows of T whose logits the caller wants
    # int32 [n_hidden]: the rows of T whose final hidden states (after the output norm) the caller wants
    hidden_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    # Media (engine/media/chunks.py): rows whose input is a medium's embedding row, those rows, and every
    # row's last visible position where some row's is not its own (a non-causal chunk); else None.
    media_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    media_embd: np.ndarray | None = None
    limits: np.ndarray | None = None
    # LoRA (engine/lora.py): per (adapter id, scale), by id, the int64 rows that run under it; () none
    lora_rows: tuple[tuple[int, float, np.ndarray], ...] = ()

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
        media: list[tuple[int, PartMedia]] = []
        lora: dict[tuple[int, float], list[int]] = {}
        for part in parts:
            base, n = len(tokens), len(part.tokens)
            first = base + min(n, max(0, part.lora_from - part.start))  # the first row under part.lora
            for key in part.lora:
                lora.setdefault(key, []).extend(range(first, base + n))
            tokens.extend(part.tokens)
            positions.extend(range(part.start, part.start + n))
            if part.media is not None:
                media.append((base, part.media))
            seq_ids.extend([part.seq_id] * n)
            if part.want_logits == "all":
                outputs.extend(range(base, base + n))
            elif part.want_logits == "last":
                outputs.append(base + n - 1)
            if part.want_hidden:
                hidden.extend(range(base, base + n))
        lora = {key: rows for key, rows in lora.items() if rows}
        batch = cls(
            np.asarray(tokens, dtype=np.int32),
            np.asarray(positions, dtype=np.int32),
            np.asarray(seq_ids, dtype=np.int32),
            np.asarray(outputs, dtype=np.int32),
            np.asarray(hidden, dtype=np.int32),
            lora_rows=tuple(
                (i, s, np.asarray(rows, dtype=np.int64)) for (i, s), rows in sorted(lora.items())
            ),
        )
        return batch.with_media(media) if media else batch

    def with_media(self, media: list[tuple[int, PartMedia]]) -> Batch:
        """This batch with its parts' media rows (each part's media and the row its part starts at)."""
        rows = np.concatenate([base + m.rows for base, m in media]).astype(np.int32)
        embd = np.concatenate([m.embeddings for _, m in media])
        limits = self.positions.copy()
        for base, m in media:
            limits[base : base + len(m.limits)] = m.limits
        causal = bool(np.array_equal(limits, self.positions))
        return replace(self, media_rows=rows, media_embd=embd, limits=None if causal else limits)
