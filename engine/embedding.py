"""Embeddings and rerank scores: a prompt's final hidden states pooled, as llama.cpp pools them.

An `EmbeddingRequest` runs as an `EmbeddingSequence` in the continuous batch beside generating
sequences: each of its prompt chunks asks for every token's final hidden state (`BatchPart.want_hidden`,
after the output norm: llama.cpp's `t_embd`), the rows are gathered until the prompt is done, then
pooled (`Pooler`: llama.cpp's build_pooling, then its build_dense_out) and answered in one event.
Pooling rank runs the GGUF's classifier head (`RankHead`) on the last token's state for causal models,
the first ([CLS]) for encoders, the mean for ModernBERT's mean-pooled classifiers (llama.cpp's choices);
a model without a head scores a document with that state's first component, as llama.cpp does (its
n_cls_out defaults to 1, and the score is the first n_cls_out floats of the pooled state). An encoder
(engine/models/encoder.py) gets its input whole in one pass (`whole`). Every step of this is per
sequence, so a request's vectors are bitwise the same whatever else shares its batches.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from engine.api import EmbeddingRequest, Pooling, Timings, TokenEvent
from engine.backend import Backend
from engine.gguf import GGUFFile
from engine.media.chunks import cut_before_media
from engine.quant import dequantize
from engine.sequence import Emit


def _vector(g: GGUFFile, name: str) -> np.ndarray | None:
    t = g.tensors.get(name)
    return None if t is None else dequantize(t.data, t.ggml_type, (1, t.shape[0])).reshape(-1)


def ggml_gelu(x: np.ndarray) -> np.ndarray:
    """ggml's CPU GELU on the host: the tanh approximation of the float16-rounded input, rounded to
    float16 (its ggml_table_gelu_f16), 0 below -10 and x above 10."""
    h = x.astype(np.float16).astype(np.float32)
    inner = np.float32(math.sqrt(2.0 / math.pi)) * h * (np.float32(1.0) + np.float32(0.044715) * h * h)
    table = (np.float32(0.5) * h * (np.float32(1.0) + np.tanh(inner))).astype(np.float16).astype(np.float32)
    return np.where(x <= -10, np.float32(0.0), np.where(x >= 10, x, table)).astype(np.float32)


def _layer_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    mean = np.float32(x.astype(np.float64).mean())
    d = x - mean
    scale = np.float32(1.0) / np.sqrt(np.float32((d.astype(np.float64) ** 2).mean()) + np.float32(eps))
    return (d * scale * weight).astype(np.float32)


@dataclass(frozen=True)
class HeadMatrix:
    """One matrix past the last layer (a classifier's, EmbeddingGemma's projections) run through the
    model's backend as llama.cpp runs it: a quantized weight quantizes its input the same way (a float
    product would differ from llama.cpp's by the int8 rounding, 0.5% of a Q8_0 reranker's score); the
    bias is added on the host."""

    backend: Backend
    weight: Any  # packed by the backend
    rows: int
    bias: np.ndarray | None

    @classmethod
    def from_gguf(cls, g: GGUFFile, backend: Backend, name: str) -> HeadMatrix | None:
        t = g.tensors.get(f"{name}.weight")
        if t is None:
            return None
        shape = (t.shape[0], t.shape[1]) if len(t.shape) == 2 else (1, t.shape[0])
        return cls(
            backend, backend.pack_weight(t.data, t.ggml_type, shape), shape[0], _vector(g, f"{name}.bias")
        )

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """The product of one vector [cols] or of rows [n, cols]."""
        be = self.backend
        rows = np.ascontiguousarray(np.atleast_2d(x), dtype=np.float32)
        out = be.empty((rows.shape[0], self.rows))
        be.matmul(be.upload(rows), self.weight, out)
        y = be.download(out) + (0.0 if self.bias is None else self.bias)
        return (y.reshape(-1) if x.ndim == 1 else y).astype(np.float32)


@dataclass(frozen=True)
class RankHead:
    """The rerank classifier of a GGUF (llama.cpp's build_pooling): an optional dense layer (`cls`, then
    tanh, or GELU and the `cls.norm` LayerNorm for ModernBERT) and the output projection (`cls.output`,
    n_cls_out scores), with Qwen3's softmax over the scores."""

    dense: HeadMatrix | None  # [n_embd, n_embd] (jina-bert-v2's: [1, n_embd], without cls.output)
    out: HeadMatrix | None  # [n_cls_out, n_embd]
    softmax: bool
    gelu: bool = False  # ModernBERT's dense layer is GELU, the others' tanh
    norm: np.ndarray | None = None  # ModernBERT's cls.norm (LayerNorm without bias) after the dense layer
    norm_eps: float = 1e-5

    @classmethod
    def from_gguf(cls, g: GGUFFile, arch: str, backend: Backend, norm_eps: float = 1e-5) -> RankHead | None:
        dense, out = HeadMatrix.from_gguf(g, backend, "cls"), HeadMatrix.from_gguf(g, backend, "cls.output")
        if dense is None and out is None:
            return None
        return cls(
            dense,
            out,
            softmax=arch in ("qwen3", "qwen3vl"),
            gelu=arch == "modern-bert",
            norm=_vector(g, "cls.norm.weight") if dense is not None else None,
            norm_eps=norm_eps,
        )

    @property
    def n_out(self) -> int:
        matrix = self.out if self.out is not None else self.dense
        assert matrix is not None
        return matrix.rows

    def __call__(self, state: np.ndarray) -> np.ndarray:
        x = state.astype(np.float32)
        if self.dense is not None:
            x = self.dense(x)
            x = ggml_gelu(x) if self.gelu else np.tanh(x)
            if self.norm is not None:
                x = _layer_norm(x, self.norm, self.norm_eps)
        if self.out is not None:
            x = self.out(x)
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


@dataclass(frozen=True)
class DenseOut:
    """EmbeddingGemma's sentence-transformers projections (`dense_2` with its bias, `dense_3`), applied
    after pooling to each vector (llama.cpp's build_dense_out)."""

    dense_2: HeadMatrix | None
    dense_3: HeadMatrix | None

    @classmethod
    def from_gguf(cls, g: GGUFFile, backend: Backend) -> DenseOut | None:
        parts = (HeadMatrix.from_gguf(g, backend, "dense_2"), HeadMatrix.from_gguf(g, backend, "dense_3"))
        return None if parts == (None, None) else cls(*parts)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        for matrix in (self.dense_2, self.dense_3):
            if matrix is not None:
                x = matrix(x)
        return x


@dataclass(frozen=True)
class Pooler:
    """How a model's final hidden states become its answer, as llama.cpp's build_pooling: pooling rank
    feeds the classifier the first token's state (encoders), the last (causal models) or the mean
    (ModernBERT's mean-pooled classifiers); the other poolings are `pool`'s; then `dense` if any."""

    head: RankHead | None = None
    rank_input: Literal["first", "last", "mean"] = "last"
    dense: DenseOut | None = None

    def __call__(self, hidden: np.ndarray, pooling: Pooling) -> np.ndarray:
        if pooling != "rank":
            out = pool(hidden, pooling)
            return out if self.dense is None else self.dense(out)
        if self.rank_input == "mean":
            state = hidden.mean(axis=0, dtype=np.float32)
        else:
            state = hidden[0] if self.rank_input == "first" else hidden[-1]
        if self.head is not None:
            return self.head(state)
        # No classifier: the score is the first float of the pooled state, after the dense projections
        # where the model has them (llama.cpp applies build_dense_out to whatever pooling gave).
        return (state if self.dense is None else self.dense(state))[:1].astype(np.float32)


@dataclass
class EmbeddingSequence:
    """One EmbeddingRequest in a slot: the prompt still to feed and the hidden rows gathered so far.

    It offers the scheduler the parts of `Sequence` it uses for a prefilling sequence."""

    request: EmbeddingRequest
    emit: Emit
    slot_id: int
    pooler: Pooler
    pending: list[int]
    whole: bool = False  # an encoder's input: its prompt goes in one batch part (`take` all or nothing)
    rows: list[np.ndarray] = field(default_factory=list)
    t_start: float = field(default_factory=time.perf_counter)
    drafts: list[int] = field(default_factory=list)  # never any: no speculation
    drafting: None = None
    generating: bool = False  # never generates: always a prompt in progress
    n_cached: int = 0
    held: bool = False  # never: only generation has `n` choices
    forks: list[int] = field(default_factory=list)

    @classmethod
    def start(
        cls, request: EmbeddingRequest, emit: Emit, slot_id: int, pooler: Pooler, whole: bool
    ) -> EmbeddingSequence:
        """The request in slot `slot_id`, all its prompt pending: an embedding never reuses a prefix
        (its `cache_prompt` is False: every token's state is wanted)."""
        return cls(request, emit, slot_id, pooler, list(request.prompt_tokens), whole)

    def take(self, budget: int) -> list[int]:
        if self.whole and len(self.pending) > budget:
            return []  # waits for a step with room for all of it
        n = cut_before_media(self.pending, budget, self.request.media)
        chunk, self.pending = self.pending[:n], self.pending[n:]
        return chunk

    def add_rows(self, hidden: np.ndarray) -> TokenEvent | None:
        """Keep one chunk's hidden states; the answer once the whole prompt is in."""
        self.rows.append(hidden)
        if self.pending:
            return None
        states = np.concatenate(self.rows) if len(self.rows) > 1 else self.rows[0]
        vector = self.pooler(states, self.request.pooling)
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
