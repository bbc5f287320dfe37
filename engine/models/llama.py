"""The llama architecture (SmolLM2): a pre-norm decoder with grouped-query attention and SwiGLU.

`forward` runs one batch of tokens from any number of sequences (prefill chunks and decode tokens mixed)
and returns the logits of the requested rows. Every kernel call goes through the backend; weights stay
in their quantized formats.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.backend import Backend
from engine.batch import Batch
from engine.embedding import Pooler, RankHead
from engine.gguf import GGUFFile, Tensor
from engine.memory.context_shift import shift_cells
from engine.memory.kv import DEFAULT_CACHE_TYPES, CacheTypes, KVCache
from engine.models.hparams import HParams
from engine.models.rope import Rope, rope_from_gguf

if TYPE_CHECKING:
    from engine.lora import LoraContext


def same_type_runs(tensors: list[Tensor]) -> list[tuple[int, int]]:
    """(start, end) of each run of consecutive tensors of one weight type: what one fused matmul takes."""
    runs, start = [], 0
    while start < len(tensors):
        end = start + 1
        while end < len(tensors) and tensors[end].ggml_type == tensors[start].ggml_type:
            end += 1
        runs.append((start, end))
        start = end
    return runs


@dataclass(frozen=True)
class _FusedWeight:
    """One matmul of a Projection: a packed weight (rows of several matrices), its bias, the split."""

    weight: Any
    bias: Any  # float32 [sum(sizes)] on the backend, or None
    sizes: list[int]
    spans: tuple[tuple[str, int], ...] = ()  # (tensor name, output columns) of each matrix: LoRA's hook


class Projection:
    """Weight matrices applied to the same input, with optional biases. Consecutive matrices of one
    format are fused into one matmul (Qwen2's V is Q6_K in some layers: Q|K fused, V apart)."""

    lora: LoraContext | None = None  # LoRA adapters (engine/lora.py), hooked by attach_adapters

    def __init__(
        self,
        backend: Backend,
        tensors: list[Tensor],
        biases: list[Tensor] | None = None,
        split: list[int] | None = None,
    ) -> None:
        """`split`: one tensor whose rows are several matrices (Phi-3's fused QKV and gate|up): its output
        comes back as columns of these sizes."""
        self.backend = backend
        self.sizes = [t.shape[0] for t in tensors] if split is None else list(split)
        self.groups: list[_FusedWeight] = []
        if split is not None:
            if len(tensors) != 1 or sum(split) != tensors[0].shape[0]:
                raise ValueError(f"cannot split {[t.shape for t in tensors]} into {split}")
            fused = self._fuse(tensors, biases)
            self.groups.append(_FusedWeight(fused.weight, fused.bias, list(split), fused.spans))
            return
        for start, end in same_type_runs(tensors):
            self.groups.append(self._fuse(tensors[start:end], None if biases is None else biases[start:end]))

    def _fuse(self, tensors: list[Tensor], biases: list[Tensor] | None) -> _FusedWeight:
        sizes = [t.shape[0] for t in tensors]
        data = np.concatenate([t.data for t in tensors], axis=0) if len(tensors) > 1 else tensors[0].data
        weight = self.backend.pack_weight(data, tensors[0].ggml_type, (sum(sizes), tensors[0].shape[1]))
        bias = None
        if biases is not None:
            bias = self.backend.upload(np.concatenate([np.asarray(b.data, dtype=np.float32) for b in biases]))
        return _FusedWeight(weight, bias, sizes, tuple((t.name, t.shape[0]) for t in tensors))

    def __call__(self, x: np.ndarray) -> list[np.ndarray]:
        n_tok = x.shape[0]
        outs: list[np.ndarray] = []
        for group in self.groups:
            out = self.backend.empty((n_tok, sum(group.sizes)))
            self.backend.matmul(x, group.weight, out)
            if self.lora is not None and self.lora.rows:
                self.lora.apply(group.spans, x, out)  # llama.cpp adds the low-rank term before the bias
            if group.bias is not None:
                self.backend.add_bias_inplace(out, group.bias)
            outs.extend([out] if len(group.sizes) == 1 else self.backend.split_cols(out, group.sizes))
        return outs


def norm_weight(backend: Backend, g: GGUFFile, name: str) -> Any:
    """A norm's weight as float32 on the backend. A copy (np.array): a view would keep faulting the
    released file pages back in."""
    return backend.upload(np.array(g.tensors[name].data, dtype=np.float32))


def optional_biases(g: GGUFFile, prefix: str, names: list[str]) -> list[Tensor] | None:
    """The biases of these matrices when the file has all of them (llama.cpp's optional biases of llama
    and mistral3), else None; a partial set stays unread, so the load refuses the file."""
    keys = [f"{prefix}{name}.bias" for name in names]
    return [g.tensors[k] for k in keys] if all(k in g.tensors for k in keys) else None


class LlamaLayer:
    ffn_norm_name = "ffn_norm.weight"  # the FFN's input norm (gpt-oss calls it post_attention_norm)

    def __init__(self, backend: Backend, g: GGUFFile, hp: HParams, il: int) -> None:
        t = g.tensors
        p = f"blk.{il}."
        self.attn_norm = norm_weight(backend, g, p + "attn_norm.weight")
        self.ffn_norm = norm_weight(backend, g, p + self.ffn_norm_name)
        self.qkv = self.qkv_projection(backend, g, hp, p)
        self.attn_out = Projection(
            backend, [t[p + "attn_output.weight"]], optional_biases(g, p, ["attn_output"])
        )
        self.init_ffn(backend, g, hp, p)

    def init_ffn(self, backend: Backend, g: GGUFFile, hp: HParams, p: str) -> None:
        """The feed-forward weights: a dense SwiGLU here (mixture-of-experts layers override)."""
        self.gate_up = self.gate_up_projection(backend, g, hp, p)
        self.down = Projection(
            backend, [g.tensors[p + "ffn_down.weight"]], optional_biases(g, p, ["ffn_down"])
        )

    def projections(self) -> list[Projection]:
        return [self.qkv, self.attn_out, self.gate_up, self.down]

    def packed_weights(self) -> list[Any]:
        """The layer's packed weight matrices (what `-lm mlock` locks)."""
        return [group.weight for projection in self.projections() for group in projection.groups]

    def qkv_projection(self, backend: Backend, g: GGUFFile, hp: HParams, p: str) -> Projection:
        """Q, K and V: three matrices, or one fused `attn_qkv` (as llama.cpp accepts for any of these)."""
        t = g.tensors
        if p + "attn_qkv.weight" in t:
            kv = hp.n_kv_head * hp.head_dim
            return Projection(backend, [t[p + "attn_qkv.weight"]], split=[hp.n_head * hp.head_dim, kv, kv])
        qkv = [t[p + "attn_q.weight"], t[p + "attn_k.weight"], t[p + "attn_v.weight"]]
        return Projection(backend, qkv, biases=self.qkv_biases(g, p))

    def gate_up_projection(self, backend: Backend, g: GGUFFile, hp: HParams, p: str) -> Projection:
        t = g.tensors
        gate_up = [t[p + "ffn_gate.weight"], t[p + "ffn_up.weight"]]
        return Projection(backend, gate_up, optional_biases(g, p, ["ffn_gate", "ffn_up"]))

    def qkv_biases(self, g: GGUFFile, prefix: str) -> list[Tensor] | None:
        """Biases of the Q, K and V projections: llama's are optional (and none of its usual files has
        them), Qwen2's required."""
        return optional_biases(g, prefix, ["attn_q", "attn_k", "attn_v"])


@dataclass(frozen=True)
class ForwardOutput:
    logits: np.ndarray  # float32 [len(batch.output_rows), n_vocab]
    hidden: np.ndarray  # float32 [len(batch.hidden_rows), n_embd]


class LlamaModel:
    layer_class: type[LlamaLayer] = LlamaLayer
    # Media (engine/media/chunks.py): `run` places their rows, and the attention takes non-causal limits.
    reads_media = True
    non_causal_media = True
    lora: LoraContext | None = None  # LoRA adapters (engine/lora.py): `run` hands them the batch's rows
    # Control vectors (engine/control_vector.py): layer -> the direction added after its output
    control: dict[int, Any] | None = None

    def __init__(
        self, g: GGUFFile, backend: Backend, on_layer: Callable[[int, int], None] | None = None
    ) -> None:
        self.hp = self.read_hparams(g)
        self.backend = backend
        self.name = str(g.metadata.get("general.name", g.path.stem))
        self.n_params = g.n_params
        self.n_bytes = g.n_bytes
        t = g.tensors
        embd = t["token_embd.weight"]
        self.token_embd = backend.pack_weight(embd.data, embd.ggml_type, embd.shape)
        head = t.get("output.weight", embd)  # tied embeddings when there is no output matrix
        self.output = (
            self.token_embd if head is embd else backend.pack_weight(head.data, head.ggml_type, head.shape)
        )
        self.output_norm = norm_weight(backend, g, "output_norm.weight")
        self.rope = rope_from_gguf(g, backend, self.hp.rope_base, self.hp.rope_neox, self.hp.n_rot)
        self.rank_head = RankHead.from_gguf(g, self.hp.arch, backend)  # a reranker's classifier
        # The file's pages are dropped after each packed piece: the weights are not held twice, not even
        # while loading (peak: the packed weights plus one layer's or the head's pages).
        g.release_pages()
        self.layers = []
        for il in range(self.hp.n_layer):
            self.layers.append(self.layer_class(backend, g, self.hp, il))
            g.release_pages()
            if on_layer is not None:
                on_layer(il + 1, self.hp.n_layer)

    @property
    def pooler(self) -> Pooler:
        """Pooling rank reads the last token's state (llama.cpp's choice for causal models)."""
        return Pooler(self.rank_head, "last")

    @classmethod
    def read_hparams(cls, g: GGUFFile) -> HParams:
        """The file's hyper-parameters (a family with keys of its own, Gemma 4's, reads them itself)."""
        return HParams.from_gguf(g)

    def packed_weights(self) -> list[Any]:
        """Every packed weight matrix of the model (the head once when it is the tied embedding)."""
        heads = [self.token_embd] if self.output is self.token_embd else [self.token_embd, self.output]
        return heads + [w for layer in self.layers for w in layer.packed_weights()]

    def rope_for(self, il: int) -> Rope:
        """RoPE of layer il (sliding-window layers may have their own)."""
        return self.rope

    def shift_kv(self, kv: KVCache, seq: int, start: int, end: int, delta: int) -> None:
        """Move a sequence's cached cells [start, end) by delta positions (context shift), every layer."""
        for il in range(self.hp.n_layer):

            def rotate(keys: np.ndarray, positions: np.ndarray, il: int = il) -> None:
                self.rope_for(il).shift(self.backend, keys, positions, kv.n_ctx)

            shift_cells(self.backend, kv.k[il][seq], kv.v[il][seq], start, end, delta, rotate, kv.head_dim)

    def new_cache(self, n_seq: int, n_ctx: int, types: CacheTypes = DEFAULT_CACHE_TYPES) -> KVCache:
        hp = self.hp
        return KVCache(hp.n_layer, n_seq, n_ctx, hp.n_kv_head, hp.head_dim, self.backend, types)

    def forward(self, batch: Batch, kv: KVCache) -> np.ndarray:
        """Logits float32 [len(batch.output_rows), n_vocab] after running every token of the batch."""
        return self.run(batch, kv).logits

    def run(self, batch: Batch, kv: KVCache) -> ForwardOutput:
        """Run every token of the batch: the logits of its output rows and the final hidden states
        (after the output norm, what llama.cpp pools for embeddings) of its hidden rows."""
        kv.check_batch(batch.seq_ids, batch.positions)
        be = self.backend
        # The batch's indices go to the backend once per step, not once per kernel.
        on_device = Batch(
            be.upload(batch.tokens if batch.media_embd is None else np.maximum(batch.tokens, 0)),
            be.upload(batch.positions),
            be.upload(batch.seq_ids),
            batch.output_rows,
            limits=None if batch.limits is None else be.upload(batch.limits),
        )
        x = self.embed(on_device.tokens)
        if batch.media_embd is not None:
            self.place_media(x, batch)
        if self.lora is not None:
            self.lora.rows = batch.lora_rows
        try:
            for il, layer in enumerate(self.layers):
                self.attention_block(il, layer, x, on_device, kv)
                self.ffn_block(layer, x)
                if self.control and il in self.control:  # llama.cpp's build_cvec, after the layer's output
                    be.add_bias_inplace(x, self.control[il])
        finally:
            if self.lora is not None:
                self.lora.rows = ()
        kv.commit(batch.seq_ids, batch.positions)
        logits = be.download(self.logits(be.take_rows(x, batch.output_rows)))
        hidden = np.zeros((0, self.hp.n_embd), dtype=np.float32)
        if len(batch.hidden_rows):
            hidden = be.download(self.norm(be.take_rows(x, batch.hidden_rows), self.output_norm))
        return ForwardOutput(logits, hidden)

    def place_media(self, x: np.ndarray, batch: Batch) -> None:
        """A medium's rows replace its positions' token embeddings, as they are: llama.cpp scales only
        token inputs (Gemma's sqrt(n_embd)), never embedding inputs."""
        assert batch.media_embd is not None
        x[batch.media_rows] = self.backend.upload(batch.media_embd)

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        x = self.backend.empty((len(tokens), self.hp.n_embd))
        self.backend.get_rows(self.token_embd, tokens, x)
        return x

    def logits(self, x: np.ndarray) -> np.ndarray:
        h = self.backend.empty(x.shape)
        self.backend.rmsnorm(x, self.output_norm, self.hp.rms_eps, h)
        out = self.backend.empty((x.shape[0], self.hp.n_vocab))
        self.backend.matmul(h, self.output, out)
        return out

    def norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        out = self.backend.empty(x.shape)
        self.backend.rmsnorm(x, weight, self.hp.rms_eps, out)
        return out

    def qkv_heads(self, layer: LlamaLayer, h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        hp = self.hp
        q, k, v = layer.qkv(h)
        n = h.shape[0]
        return (
            q.reshape(n, hp.n_head, hp.head_dim),
            k.reshape(n, hp.n_kv_head, hp.head_dim),
            v.reshape(n, hp.n_kv_head, hp.head_dim),
        )

    def attend(
        self, il: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, batch: Batch, kv: KVCache
    ) -> np.ndarray:
        """Store k/v in the cache, attend, and return the heads concatenated: [T, n_head * head_dim]."""
        out = self.attend_heads(il, q, k, v, batch, kv)
        return out.reshape(q.shape[0], q.shape[1] * q.shape[2])

    def attend_heads(
        self, il: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, batch: Batch, kv: KVCache
    ) -> np.ndarray:
        """Store k/v in the cache and attend: each head's output, [T, n_head, head_dim]."""
        hp, be = self.hp, self.backend
        be.store_kv(k, v, batch.seq_ids, batch.positions, kv.k[il], kv.v[il])
        out = be.empty(q.shape)
        args = (batch.seq_ids, batch.positions, self.window(il), hp.attn_scale, out)
        be.attention(q, kv.k[il], kv.v[il], *args, limits=batch.limits)  # limits: a non-causal medium
        return out

    def window(self, il: int) -> int:
        """Layer `il`'s sliding window (0: it attends to every cell)."""
        return self.hp.sliding_window if self.hp.swa_layers[il] else 0

    def attention_block(self, il: int, layer: LlamaLayer, x: np.ndarray, batch: Batch, kv: KVCache) -> None:
        (o,) = layer.attn_out(self.attention(il, layer, self.norm(x, layer.attn_norm), batch, kv))
        self.backend.add_inplace(x, o)

    def attention(self, il: int, layer: LlamaLayer, h: np.ndarray, batch: Batch, kv: KVCache) -> np.ndarray:
        """Self-attention of the normed input h: project, (norm,) rotate, attend; before the output matrix."""
        q, k, v = self.qkv_heads(layer, h)
        self.qk_norm(layer, q, k)
        rope = self.rope_for(il)
        rope.apply(self.backend, q, batch.positions, kv.n_ctx)
        rope.apply(self.backend, k, batch.positions, kv.n_ctx)
        self.scale_queries(q, batch)
        return self.attend(il, q, k, v, batch, kv)

    def qk_norm(self, layer: LlamaLayer, q: np.ndarray, k: np.ndarray) -> None:
        """Per-head norms of queries and keys before RoPE (Qwen3, Gemma 3); llama has none."""

    def scale_queries(self, q: np.ndarray, batch: Batch) -> None:
        """Position-dependent query scaling (Ministral 3's attention temperature); llama has none."""

    def head_norm(self, x: np.ndarray, weight: np.ndarray) -> None:
        """RMSNorm of each head of x[T, heads, head_dim], in place."""
        flat = x.reshape(x.shape[0] * x.shape[1], x.shape[2])
        self.backend.rmsnorm(flat, weight, self.hp.rms_eps, flat)

    def ffn_block(self, layer: LlamaLayer, x: np.ndarray) -> None:
        gate, up = layer.gate_up(self.norm(x, layer.ffn_norm))
        self.backend.silu_mul(gate, up, gate)
        (down,) = layer.down(gate)
        self.backend.add_inplace(x, down)
