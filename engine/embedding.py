"""Embeddings and rerank scores: a prompt's final hidden states pooled, as llama.cpp pools them.

An `EmbeddingRequest` runs as an `EmbeddingSequence` in the continuous batch beside generating
sequences: each of its prompt chunks asks for every token's final hidden state (`BatchPart.want_hidden`,
after the output norm: llama.cpp's `t_embd`), the rows are gathered until the prompt is done, then
pooled (`pool`) and answered in one event. Pooling rank runs the GGUF's classifier head (`RankHead`) on
the last token's state (llama.cpp's choice for causal models); a model without a head scores a document
with that state's first component, as llama.cpp does (its n_cls_out defaults to 1, and the score is the
first n_cls_out floats of the pooled state). Every step of this is per sequence, so
a request's vectors are bitwise the same whatever else shares its batches.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from engine.api import EmbeddingRequest, Pooling, Timings, TokenEvent
from engine.gguf import GGUFFile
from engine.quant import dequantize
from engine.sequence import Emit


def _matrix(g: GGUFFile, name: str) -> np.ndarray | None:
    t = g.tensors.get(name)
    if t is None:
        return None
    shape = (t.shape[0], t.shape[1]) if len(t.shape) == 2 else (1, t.shape[0])
    return dequantize(t.data, t.ggml_type, shape)


@dataclass(frozen=True)
class RankHead:
    """The rerank classifier of a GGUF: an optional dense layer (`cls`, tanh) and the output projection
    (`cls.output`, n_cls_out scores), with Qwen3's softmax over the scores (llama.cpp's build_pooling)."""

    dense: np.ndarray | None  # float32 [n_embd, n_embd]
    dense_bias: np.ndarray | None
    out: np.ndarray | None  # float32 [n_cls_out, n_embd]
    out_bias: np.ndarray | None
    softmax: bool

    @classmethod
    def from_gguf(cls, g: GGUFFile, arch: str) -> RankHead | None:
        dense, out = _matrix(g, "cls.weight"), _matrix(g, "cls.output.weight")
        if dense is None and out is None:
            return None
        dense_bias, out_bias = _matrix(g, "cls.bias"), _matrix(g, "cls.output.bias")
        return cls(
            dense,
            None if dense_bias is None else dense_bias.reshape(-1),
            out,
            None if out_bias is None else out_bias.reshape(-1),
            softmax=arch in ("qwen3", "qwen3vl"),
        )

    @property
    def n_out(self) -> int:
        matrix = self.out if self.out is not None else self.dense
        assert matrix is not None
        return matrix.shape[0]

    def __call__(self, state: np.ndarray) -> np.ndarray:
        x = state.astype(np.float32)
        if self.dense is not None:
            x = self.dense @ x + (0.0 if self.dense_bias is None else self.dense_bias)
            x = np.tanh(x)
        if self.out is not None:
            x = self.out @ x + (0.0 if self.out_bias is None else self.out_bias)
        if self.softmax:
            e = np.exp(x - x.max())
            x = e / e.sum()
        return x.astype(np.float32)


def pool(hidden: np.ndarray, pooling: Pooling, head: RankHead | None = None) -> np.ndarray:
    """The answer of a prompt whose final hidden states are `hidden` [n_tokens, n_embd]."""
    if pooling == "none":
        return hidden
    if pooling == "mean":
        return hidden.mean(axis=0, dtype=np.float32)
    if pooling == "cls":
        return hidden[0]
    if pooling == "last":
        return hidden[-1]
    if head is None:
        # llama-server starts and serves `--reranking` on any model: without a classifier the score is
        # the first component of the last token's normed state (a number, if not a meaningful one).
        return hidden[-1][:1].astype(np.float32)
    return head(hidden[-1])


@dataclass
class EmbeddingSequence:
    """One EmbeddingRequest in a slot: the prompt still to feed and the hidden rows gathered so far.

    It offers the scheduler the parts of `Sequence` it uses for a prefilling sequence."""

    request: EmbeddingRequest
    emit: Emit
    slot_id: int
    head: RankHead | None
    pending: list[int]
    rows: list[np.ndarray] = field(default_factory=list)
    t_start: float = field(default_factory=time.perf_counter)
    drafts: list[int] = field(default_factory=list)  # never any: no speculation
    drafting: None = None
    generating: bool = False  # never generates: always a prompt in progress
    n_cached: int = 0
    held: bool = False  # never: only generation has `n` choices
    forks: list[int] = field(default_factory=list)

    def take(self, budget: int) -> list[int]:
        chunk, self.pending = self.pending[:budget], self.pending[budget:]
        return chunk

    def add_rows(self, hidden: np.ndarray) -> TokenEvent | None:
        """Keep one chunk's hidden states; the answer once the whole prompt is in."""
        self.rows.append(hidden)
        if self.pending:
            return None
        states = np.concatenate(self.rows) if len(self.rows) > 1 else self.rows[0]
        vector = pool(states, self.request.pooling, self.head)
        return TokenEvent(
            text="",
            finish_reason="stop",
            embedding=vector,
            timings=self.timings(),
            n_prompt=len(self.request.prompt_tokens),
            id_slot=self.slot_id,
        )

    def timings(self) -> Timings:
        ms = 1e3 * (time.perf_counter() - self.t_start)
        return Timings(
            cache_n=0, prompt_n=len(self.request.prompt_tokens), prompt_ms=ms, predicted_n=0, predicted_ms=0.0
        )

    def finished_early(self, reason: str, error: str | None = None) -> TokenEvent:
        return TokenEvent(text="", finish_reason=reason, id_slot=self.slot_id, error=error)
