"""The llama architecture (SmolLM2): a pre-norm decoder with grouped-query attention and SwiGLU.

`forward` runs one batch of tokens from any number of sequences (prefill chunks and decode tokens mixed)
and returns the logits of the requested rows. Every kernel call goes through the backend; weights stay
in their quantized formats.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.backend import Backend
from engine.batch import Batch
from engine.context_shift import shift_cells
from engine.gguf import GGUFFile, Tensor
from engine.kv import KVCache
from engine.models.hparams import HParams


@dataclass(frozen=True)
class _FusedWeight:
    """One matmul of a Projection: a packed weight (rows of several matrices), its bias, the split."""

    weight: Any
    bias: Any  # float32 [sum(sizes)] on the backend, or None
    sizes: list[int]


class Projection:
    """Weight matrices applied to the same input, with optional biases. Consecutive matrices of one
    format are fused into one matmul (Qwen2's V is Q6_K in some layers: Q|K fused, V apart)."""

    def __init__(self, backend: Backend, tensors: list[Tensor], biases: list[Tensor] | None = None) -> None:
        self.backend = backend
        self.sizes = [t.shape[0] for t in tensors]
        self.groups: list[_FusedWeight] = []
        start = 0
        while start < len(tensors):
            end = start + 1
            while end < len(tensors) and tensors[end].ggml_type == tensors[start].ggml_type:
                end += 1
            self.groups.append(self._fuse(tensors[start:end], None if biases is None else biases[start:end]))
            start = end

    def _fuse(self, tensors: list[Tensor], biases: list[Tensor] | None) -> _FusedWeight:
        sizes = [t.shape[0] for t in tensors]
        data = np.concatenate([t.data for t in tensors], axis=0) if len(tensors) > 1 else tensors[0].data
        weight = self.backend.pack_weight(data, tensors[0].ggml_type, (sum(sizes), tensors[0].shape[1]))
        bias = None
        if biases is not None:
            bias = self.backend.upload(np.concatenate([np.asarray(b.data, dtype=np.float32) for b in biases]))
        return _FusedWeight(weight, bias, sizes)

    def __call__(self, x: np.ndarray) -> list[np.ndarray]:
        n_tok = x.shape[0]
        outs: list[np.ndarray] = []
        for group in self.groups:
            out = self.backend.empty((n_tok, sum(group.sizes)))
            self.backend.matmul(x, group.weight, out)
            if group.bias is not None:
                self.backend.add_bias_inplace(out, group.bias)
            outs.extend([out] if len(group.sizes) == 1 else self.backend.split_cols(out, group.sizes))
        return outs


class LlamaLayer:
    def __init__(self, backend: Backend, g: GGUFFile, il: int) -> None:
        t = g.tensors
        p = f"blk.{il}."
        # Copies (np.array): a view would keep faulting the released file pages back in.
        self.attn_norm = backend.upload(np.array(t[p + "attn_norm.weight"].data, dtype=np.float32))
        self.ffn_norm = backend.upload(np.array(t[p + "ffn_norm.weight"].data, dtype=np.float32))
        self.qkv = Projection(
            backend,
            [t[p + "attn_q.weight"], t[p + "attn_k.weight"], t[p + "attn_v.weight"]],
            biases=self.qkv_biases(g, p),
        )
        self.attn_out = Projection(backend, [t[p + "attn_output.weight"]])
        self.gate_up = Projection(backend, [t[p + "ffn_gate.weight"], t[p + "ffn_up.weight"]])
        self.down = Projection(backend, [t[p + "ffn_down.weight"]])

    def projections(self) -> list[Projection]:
        return [self.qkv, self.attn_out, self.gate_up, self.down]

    def qkv_biases(self, g: GGUFFile, prefix: str) -> list[Tensor] | None:
        """Biases of the Q, K and V projections (llama has none)."""
        return None


class LlamaModel:
    layer_class: type[LlamaLayer] = LlamaLayer

    def __init__(
        self, g: GGUFFile, backend: Backend, on_layer: Callable[[int, int], None] | None = None
    ) -> None:
        self.hp = HParams.from_gguf(g)
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
        self.output_norm = backend.upload(np.array(t["output_norm.weight"].data, dtype=np.float32))
        # The file's pages are dropped after each packed piece: the weights are not held twice, not even
        # while loading (peak: the packed weights plus one layer's or the head's pages).
        g.release_pages()
        self.layers = []
        for il in range(self.hp.n_layer):
            self.layers.append(self.layer_class(backend, g, il))
            g.release_pages()
            if on_layer is not None:
                on_layer(il + 1, self.hp.n_layer)

    def packed_weights(self) -> list[Any]:
        """Every packed weight matrix of the model (the head once when it is the tied embedding)."""
        heads = [self.token_embd] if self.output is self.token_embd else [self.token_embd, self.output]
        layers = [g.weight for layer in self.layers for p in layer.projections() for g in p.groups]
        return heads + layers

    def rope_base(self, il: int) -> float:
        """RoPE base of layer il (sliding-window layers have their own)."""
        hp = self.hp
        return hp.rope_base_swa if hp.swa_layers[il] else hp.rope_base

    def shift_kv(self, kv: KVCache, seq: int, start: int, end: int, delta: int) -> None:
        """Move a sequence's cached cells [start, end) by delta positions (context shift), every layer."""
        for il in range(self.hp.n_layer):

            def rotate(keys: np.ndarray, positions: np.ndarray, il: int = il) -> None:
                self.backend.rope(keys, positions, self.rope_base(il), self.hp.rope_neox)

            shift_cells(self.backend, kv.k[il][seq], kv.v[il][seq], start, end, delta, rotate)

    def new_cache(self, n_seq: int, n_ctx: int) -> KVCache:
        hp = self.hp
        return KVCache(hp.n_layer, n_seq, n_ctx, hp.n_kv_head, hp.head_dim, self.backend)

    def forward(self, batch: Batch, kv: KVCache) -> np.ndarray:
        """Logits float32 [len(batch.output_rows), n_vocab] after running every token of the batch."""
        kv.check_batch(batch.seq_ids, batch.positions)
        be = self.backend
        # The batch's indices go to the backend once per step, not once per kernel.
        on_device = Batch(
            be.upload(batch.tokens), be.upload(batch.positions), be.upload(batch.seq_ids), batch.output_rows
        )
        x = self.embed(on_device.tokens)
        for il, layer in enumerate(self.layers):
            self.attention_block(il, layer, x, on_device, kv)
            self.ffn_block(layer, x)
        kv.commit(batch.seq_ids, batch.positions)
        return be.download(self.logits(be.take_rows(x, batch.output_rows)))

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
        hp, be = self.hp, self.backend
        be.store_kv(k, v, batch.seq_ids, batch.positions, kv.k[il], kv.v[il])
        out = be.empty(q.shape)
        window = hp.sliding_window if hp.swa_layers[il] else 0
        be.attention(q, kv.k[il], kv.v[il], batch.seq_ids, batch.positions, window, hp.attn_scale, out)
        return out.reshape(q.shape[0], q.shape[1] * q.shape[2])

    def attention_block(self, il: int, layer: LlamaLayer, x: np.ndarray, batch: Batch, kv: KVCache) -> None:
        q, k, v = self.qkv_heads(layer, self.norm(x, layer.attn_norm))
        self.backend.rope(q, batch.positions, self.hp.rope_base, self.hp.rope_neox)
        self.backend.rope(k, batch.positions, self.hp.rope_base, self.hp.rope_neox)
        (o,) = layer.attn_out(self.attend(il, q, k, v, batch, kv))
        self.backend.add_inplace(x, o)

    def ffn_block(self, layer: LlamaLayer, x: np.ndarray) -> None:
        gate, up = layer.gate_up(self.norm(x, layer.ffn_norm))
        self.backend.silu_mul(gate, up, gate)
        (down,) = layer.down(gate)
        self.backend.add_inplace(x, down)
