"""What the encoder families (BERT and kin: engine/models/bert.py and its siblings) share.

An encoder reads each input whole in one forward pass: every token attends to every token of its own
input (never to another input packed into the same pass), and nothing is kept afterwards, so its memory
is a `StatelessMemory` (engine/memory/stateless.py) and the scheduler hands it whole inputs. Its answer
is the final hidden states (llama.cpp's `t_embd`), pooled by engine/embedding.py's `Pooler`; it has no
output head, so it never generates (the engine refuses a generation on it).

`EncoderModel` holds the file's hyper-parameters, the token embeddings, the layers and the pooling; a
family says how its input embeddings are made (`embed`), what one layer does (`layer_forward`) and what
comes after the last (`final`). Layers are built from the pieces here: `LayerNorm`, `qkv_projection`,
`EncoderAttention` (the non-causal CPU kernel, with RoPE, ALiBi or neither) and the feed-forwards.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.backend import Backend
from engine.batch import Batch
from engine.embedding import Pooler, RankHead
from engine.gguf import GGUFFile, UnsupportedModelError
from engine.memory.kv import DEFAULT_CACHE_TYPES, CacheTypes
from engine.memory.stateless import StatelessMemory
from engine.models.llama import ForwardOutput, Projection, optional_biases
from engine.models.rope import Rope
from engine.quant import dequantize

# llama.cpp's pooling_type numbering (GGUF `<arch>.pooling_type`, `classifier.pooling_type`).
POOLING_NAMES = ("none", "mean", "cls", "last", "rank")


@dataclass(frozen=True)
class EncoderHParams:
    arch: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_kv_head: int
    head_dim: int
    n_vocab: int
    n_ctx_train: int
    norm_eps: float  # LayerNorm's epsilon (RMSNorm's for EmbeddingGemma)
    causal: bool  # `attention.causal`: llama.cpp's default is causal; encoder files say false
    rope_base: float
    n_rot: int
    rope_base_swa: float = 10000.0  # llama.cpp's default where the file has no rope.freq_base_swa
    sliding_window: int = 0  # symmetric window of the layers in swa_layers (0: none)
    swa_layers: tuple[bool, ...] = ()

    @classmethod
    def from_gguf(cls, g: GGUFFile, eps_key: str = "attention.layer_norm_epsilon") -> EncoderHParams:
        n_embd = int(g.arch_value("embedding_length"))
        n_head = int(g.arch_value("attention.head_count"))
        head_dim = int(g.arch_value("attention.key_length", n_embd // n_head))
        n_layer = int(g.arch_value("block_count"))
        return cls(
            arch=g.require_architecture(),
            n_layer=n_layer,
            n_embd=n_embd,
            n_ff=int(g.arch_value("feed_forward_length")),
            n_head=n_head,
            n_kv_head=int(g.arch_value("attention.head_count_kv", n_head)),
            head_dim=head_dim,
            n_vocab=len(g.metadata["tokenizer.ggml.tokens"]),
            n_ctx_train=int(g.arch_value("context_length")),
            norm_eps=float(g.arch_value(eps_key)),
            causal=bool(g.arch_value("attention.causal", True)),
            rope_base=float(g.arch_value("rope.freq_base", 10000.0)),
            n_rot=int(g.arch_value("rope.dimension_count", head_dim)),
            rope_base_swa=float(g.arch_value("rope.freq_base_swa", 10000.0)),
            swa_layers=(False,) * n_layer,
        )

    @property
    def attn_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)


def host_vector(g: GGUFFile, name: str) -> np.ndarray:
    """A 1-D tensor as float32 on the host (a copy: the file's pages are released after loading)."""
    t = g.tensors[name]
    return dequantize(t.data, t.ggml_type, (1, t.shape[0])).reshape(-1).copy()


def host_matrix(g: GGUFFile, name: str) -> np.ndarray:
    t = g.tensors[name]
    return dequantize(t.data, t.ggml_type, (t.shape[0], t.shape[1]))


class LayerNorm:
    """A LayerNorm's weight and optional bias on the backend; `bias="optional"` reads it when present."""

    def __init__(self, backend: Backend, g: GGUFFile, name: str, eps: float, bias: bool | str = True) -> None:
        self.backend = backend
        self.eps = eps
        self.weight = backend.upload(host_vector(g, f"{name}.weight"))
        has_bias = bias is True or (bias == "optional" and f"{name}.bias" in g.tensors)
        self.bias = backend.upload(host_vector(g, f"{name}.bias")) if has_bias else None

    def __call__(self, x: Any, out: Any = None) -> Any:
        out = self.backend.empty(x.shape) if out is None else out
        assert self.backend.layernorm is not None
        self.backend.layernorm(x, self.weight, self.bias, self.eps, out)
        return out


def qkv_projection(backend: Backend, g: GGUFFile, hp: EncoderHParams, p: str) -> Projection:
    """Q, K and V: one fused `attn_qkv` (with its bias when present) or three matrices with biases (all or
    none of them), as llama.cpp's create_tensor_qkv accepts them."""
    t = g.tensors
    q_dim, kv_dim = hp.n_head * hp.head_dim, hp.n_kv_head * hp.head_dim
    if p + "attn_qkv.weight" in t:
        bias = [t[p + "attn_qkv.bias"]] if p + "attn_qkv.bias" in t else None
        return Projection(backend, [t[p + "attn_qkv.weight"]], bias, split=[q_dim, kv_dim, kv_dim])
    names = ["attn_q", "attn_k", "attn_v"]
    return Projection(backend, [t[f"{p}{n}.weight"] for n in names], optional_biases(g, p, names))


def linear(backend: Backend, g: GGUFFile, name: str, bias: bool | str = "optional") -> Projection:
    """One matrix `name.weight` with its bias (`bias`: True required, "optional", False none)."""
    t = g.tensors
    has_bias = bias is True or (bias == "optional" and f"{name}.bias" in t)
    return Projection(backend, [t[f"{name}.weight"]], [t[f"{name}.bias"]] if has_bias else None)


def alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """ggml's ALiBi slope per head (soft_max_ext with max_bias): m0^(h+1) for the first 2^floor(log2 n)
    heads, m1^(2(h - that) + 1) for the rest."""
    n_log2 = 2 ** int(math.floor(math.log2(n_head)))
    m0 = np.float32(2.0) ** np.float32(-max_bias / n_log2)
    m1 = np.float32(2.0) ** np.float32(-(max_bias / 2.0) / n_log2)
    slopes = [
        m0 ** np.float32(h + 1) if h < n_log2 else m1 ** np.float32(2 * (h - n_log2) + 1)
        for h in range(n_head)
    ]
    return np.asarray(slopes, dtype=np.float32)


def input_spans(seq_ids: np.ndarray) -> np.ndarray:
    """[T, 2]: each token's input as rows [start, end) of the batch (a run of one sequence id)."""
    n = len(seq_ids)
    starts = np.flatnonzero(np.r_[True, seq_ids[1:] != seq_ids[:-1]]) if n else np.zeros(0, np.int64)
    ends = np.r_[starts[1:], n]
    lengths = ends - starts
    return np.stack([np.repeat(starts, lengths), np.repeat(ends, lengths)], axis=1).astype(np.int64)


@dataclass(frozen=True)
class Pass:
    """One forward pass's per-token facts the layers need: positions, input spans."""

    positions: Any  # int32 [T] on the backend
    spans: np.ndarray  # int64 [T, 2]


class EncoderModel:
    reads_media = False
    """The shared encoder: embeddings, layers, final states; families fill in the hooks."""

    def __init__(
        self, g: GGUFFile, backend: Backend, on_layer: Callable[[int, int], None] | None = None
    ) -> None:
        if backend.encoder_attention is None or backend.layernorm is None:
            raise UnsupportedModelError(f"{g.architecture} runs on the CPU only (start with --device cpu)")
        self.hp = self.read_hparams(g)
        self.backend = backend
        self.name = str(g.metadata.get("general.name", g.path.stem))
        self.n_params = g.n_params
        self.n_bytes = g.n_bytes
        embd = g.tensors["token_embd.weight"]
        self.token_embd = backend.pack_weight(embd.data, embd.ggml_type, embd.shape)
        self.read_inputs(g)
        self.pooler = self.read_pooler(g)
        self.rank_head = self.pooler.head
        g.release_pages()
        self.layers = []
        for il in range(self.hp.n_layer):
            self.layers.append(self.read_layer(g, il))
            g.release_pages()
            if on_layer is not None:
                on_layer(il + 1, self.hp.n_layer)

    # -- what a family provides ---------------------------------------------------------------------------
    @classmethod
    def read_hparams(cls, g: GGUFFile) -> EncoderHParams:
        return EncoderHParams.from_gguf(g)

    def read_inputs(self, g: GGUFFile) -> None:
        """The input side beyond the token embeddings (position and type tables, the embedding norm)."""

    def read_layer(self, g: GGUFFile, il: int) -> Any:
        raise NotImplementedError

    def embed(self, batch: Batch) -> Any:
        """The input embeddings of the batch's tokens: [T, n_embd]."""
        x = self.backend.empty((batch.n_tokens, self.hp.n_embd))
        self.backend.get_rows(self.token_embd, batch.tokens, x)
        return x

    def layer_forward(self, il: int, layer: Any, x: Any, step: Pass) -> Any:
        raise NotImplementedError

    def final(self, x: Any) -> Any:
        """What follows the last layer before pooling (ModernBERT's and EmbeddingGemma's output norm)."""
        return x

    def read_pooler(self, g: GGUFFile) -> Pooler:
        """The rank classifier (`cls`, `cls.output`) on the first token, and the file's default pooling."""
        head = RankHead.from_gguf(g, self.hp.arch, self.backend)
        return Pooler(head, rank_input="last" if self.hp.causal else "first")

    # -- the engine's interface -----------------------------------------------------------------------------
    def packed_weights(self) -> list[Any]:
        weights = [self.token_embd]
        for layer in self.layers:
            weights += [group.weight for proj in layer.projections() for group in proj.groups]
        return weights

    def new_cache(self, n_seq: int, n_ctx: int, types: CacheTypes = DEFAULT_CACHE_TYPES) -> StatelessMemory:
        """An encoder keeps nothing between passes: a memory that holds nothing (and takes no cell types)."""
        return StatelessMemory(n_seq, n_ctx)

    def forward(self, batch: Batch, memory: StatelessMemory) -> np.ndarray:
        return self.run(batch, memory).logits

    def run(self, batch: Batch, memory: StatelessMemory) -> ForwardOutput:
        """Every input of the batch whole: the final hidden states of its hidden rows (no logits: an
        encoder has no output head, so any output row asked for gets an empty one)."""
        memory.check_batch(batch.seq_ids, batch.positions)
        be = self.backend
        step = Pass(be.upload(batch.positions), input_spans(batch.seq_ids))
        on_device = Batch(
            be.upload(batch.tokens), step.positions, be.upload(batch.seq_ids), batch.output_rows
        )
        x = self.embed(on_device)
        for il, layer in enumerate(self.layers):
            x = self.layer_forward(il, layer, x, step)
        hidden = np.zeros((0, self.hp.n_embd), dtype=np.float32)
        if len(batch.hidden_rows):
            hidden = be.download(self.final(be.take_rows(x, batch.hidden_rows)))
        return ForwardOutput(np.zeros((len(batch.output_rows), 0), dtype=np.float32), hidden)


class EncoderAttention:
    """Self-attention over each input (engine/cpu/encoder_attention.py): Q/K/V, optional RoPE (`rope`),
    ALiBi (`slopes`), a symmetric window, and the output projection."""

    def __init__(self, hp: EncoderHParams, backend: Backend, qkv: Projection, out: Projection) -> None:
        self.hp = hp
        self.backend = backend
        self.qkv = qkv
        self.out = out
        self.slopes = np.zeros(hp.n_head, dtype=np.float32)

    def projections(self) -> list[Projection]:
        return [self.qkv, self.out]

    def heads(self, h: Any) -> tuple[Any, Any, Any]:
        hp, n = self.hp, h.shape[0]
        q, k, v = self.qkv(h)
        return (
            q.reshape(n, hp.n_head, hp.head_dim),
            k.reshape(n, hp.n_kv_head, hp.head_dim),
            v.reshape(n, hp.n_kv_head, hp.head_dim),
        )

    def attend(self, q: Any, k: Any, v: Any, step: Pass, window: int = 0, scale: float | None = None) -> Any:
        """The heads' outputs through the output projection: [T, n_embd]."""
        be, hp = self.backend, self.hp
        o = be.empty(q.shape)
        assert be.encoder_attention is not None
        scale = hp.attn_scale if scale is None else scale
        be.encoder_attention(q, k, v, step.spans, step.positions, hp.causal, window, self.slopes, scale, o)
        (out,) = self.out(o.reshape(q.shape[0], q.shape[1] * q.shape[2]))
        return out

    def __call__(self, h: Any, step: Pass, rope: Rope | None = None, window: int = 0) -> Any:
        q, k, v = self.heads(h)
        if rope is not None:
            rope.apply(self.backend, q, step.positions, 0)
            rope.apply(self.backend, k, step.positions, 0)
        return self.attend(q, k, v, step, window)


class FeedForward:
    """llama.cpp's encoder feed-forwards, then the down matrix: `seq` gelu(up x) (BERT); `geglu`
    gelu(first half) * second half of one fused up matrix (ModernBERT, jina-bert-v2); `par` act(gate x) *
    up x, act silu (nomic-bert) or gelu (jina-bert-v2 with a gate, EmbeddingGemma), the gate either its
    own projection or fused with up (`up` then gives gate and up)."""

    def __init__(
        self,
        backend: Backend,
        up: Projection,
        down: Projection,
        kind: str,
        act: str = "gelu",
        gate: Projection | None = None,
    ) -> None:
        self.backend = backend
        self.up, self.down, self.gate = up, down, gate
        self.kind = kind
        self.act = act

    def projections(self) -> list[Projection]:
        return [self.up, self.down] + ([self.gate] if self.gate is not None else [])

    def __call__(self, x: Any) -> Any:
        be = self.backend
        if self.kind == "seq":
            (h,) = self.up(x)
            assert be.gelu is not None
            be.gelu(h, h)
        else:
            gate, up = self._gate_and_up(x)
            (be.silu_mul if self.act == "silu" else be.gelu_mul)(gate, up, gate)
            h = gate
        (out,) = self.down(h)
        return out

    def _gate_and_up(self, x: Any) -> tuple[Any, Any]:
        if self.kind == "geglu":
            (fused,) = self.up(x)
            half = fused.shape[1] // 2
            gate, up = self.backend.split_cols(fused, [half, half])
            return gate, up
        if self.gate is None:
            gate, up = self.up(x)
            return gate, up
        (gate,) = self.gate(x)
        (up,) = self.up(x)
        return gate, up
