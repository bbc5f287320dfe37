"""Gemma 4 (`gemma4`: gemma-4-31B, 26B-A4B, E2B, E4B) on the llama decoder, as llama.cpp's
src/models/gemma4.cpp computes it:

- the embedding scaled by sqrt(n_embd); E2B/E4B add per-layer embedding inputs (`PerLayerInputs`), each
  layer's gated by GELU(`inp_gate` x), projected (`proj`), RMS-normed and added after the FFN;
- attention with per-head q/k RMS norms (weights as stored: Gemma 4's norms have no +1), values RMS-normed
  without a weight, scale 1 (no 1/sqrt(head_dim)); sliding-window layers (`attention.sliding_window`,
  RoPE base `rope.freq_base_swa`, `rope.dimension_count_swa` dims) and global layers (`rope.freq_base`
  with `rope_freqs.weight`: the converter's proportional RoPE) each with their head dim and kv heads;
  V is K's projection where a layer has no `attn_v`; shared-KV layers (`attention.shared_kv_layers`)
  compute only queries and read the cells of the last sliding or global layer that has its own;
- post-attention and post-FFN norms (Gemma 3's), a GELU FFN, with routed experts beside it in 26B-A4B
  (engine/models/gemma4_layers.py: their input norm, post-norms and router), then the layer's
  `layer_output_scale`;
- the head tied to the embedding, and final logit soft-capping cap * tanh(logits / cap).

The KV cache holds every layer with a cache at the widest layer's geometry (heads and head_dim): a layer
with fewer kv heads attends over a view of its first heads, and a narrower head fills the start of each
row (the kernels take the head dim from the queries). That costs memory on the layers that are narrower
(llama.cpp sizes each layer's cells, and sliding-window layers to the window); it keeps one KVCache, so
prompt caching, slot files and context shift work unchanged.

Soft-capping runs on the host, in numpy, on the logits the step downloads anyway: one tanh per logit of
the output rows (0.14 ms a row of a 262k vocabulary here), so it needs no kernel on any backend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine.backend import Backend
from engine.batch import Batch
from engine.gguf import GGUFFile
from engine.memory.context_shift import shift_cells
from engine.memory.kv import DEFAULT_CACHE_TYPES, CacheTypes, KVCache
from engine.memory.kv_types import check_head_dim
from engine.models.gemma4_layers import Gemma4HParams, Gemma4Layer, PerLayerInputs
from engine.models.hparams import HParams
from engine.models.llama import ForwardOutput, LlamaModel
from engine.models.rope import Rope


class Gemma4Model(LlamaModel):
    reads_media = False  # its own `run` places no media rows
    layer_class = Gemma4Layer
    hp: Gemma4HParams
    layers: list[Gemma4Layer]

    def __init__(
        self, g: GGUFFile, backend: Backend, on_layer: Callable[[int, int], None] | None = None
    ) -> None:
        super().__init__(g, backend, on_layer)
        hp = self.hp
        self.rope_swa = Rope.plain(backend, hp.rope_base_swa, True, hp.n_rot_swa)
        self.per_layer_inputs = PerLayerInputs(backend, g, hp) if hp.n_embd_per_layer else None
        self.ones = {d: backend.upload(np.ones(d, np.float32)) for d in set(hp.head_dims)}  # V's norm
        # The current step's per-layer inputs (from `embed`, read by each layer's FFN block).
        self.layer_inputs: list[Any] = []

    @classmethod
    def read_hparams(cls, g: GGUFFile) -> HParams:
        return Gemma4HParams.from_gguf(g)

    def packed_weights(self) -> list[Any]:
        extra = [] if self.per_layer_inputs is None else self.per_layer_inputs.packed_weights()
        return super().packed_weights() + extra

    def rope_for(self, il: int) -> Rope:
        return self.rope_swa if self.hp.swa_layers[il] else self.rope

    # -- the KV cache --------------------------------------------------------------------------------

    def new_cache(self, n_seq: int, n_ctx: int, types: CacheTypes = DEFAULT_CACHE_TYPES) -> KVCache:
        hp = self.hp
        for head_dim in set(hp.head_dims):  # each layer's rows must be whole blocks of the cell type
            check_head_dim(types.k, head_dim)
            check_head_dim(types.v, head_dim)
        return KVCache(hp.n_layer_kv, n_seq, n_ctx, hp.n_kv_head, hp.head_dim, self.backend, types)

    def cells(self, kv: KVCache, il: int) -> tuple[Any, Any]:
        """Layer il's keys and values [n_seq, its kv heads, n_ctx, row] (a shared-KV layer: the layer's
        it reads)."""
        c, n_kv = self.hp.cache_layer(il), self.hp.kv_heads[il]
        k, v = kv.k[c], kv.v[c]
        return (k, v) if n_kv == kv.n_kv_heads else (k[:, :n_kv], v[:, :n_kv])

    def shift_kv(self, kv: KVCache, seq: int, start: int, end: int, delta: int) -> None:
        """Move a sequence's cells [start, end) by delta positions in every layer with its own cells,
        each with its head dim and RoPE."""
        for il in range(self.hp.n_layer_kv):
            head_dim, rope = self.hp.head_dims[il], self.rope_for(il)
            k, v = self.cells(kv, il)
            k_row, v_row = kv.types.k.row_size(head_dim), kv.types.v.row_size(head_dim)

            def rotate(keys: Any, positions: Any, rope: Rope = rope) -> None:
                rope.shift(self.backend, keys, positions, kv.n_ctx)

            shift_cells(
                self.backend, k[seq][:, :, :k_row], v[seq][:, :, :v_row], start, end, delta, rotate, head_dim
            )

    # -- the forward pass ----------------------------------------------------------------------------

    def run(self, batch: Batch, kv: KVCache) -> ForwardOutput:
        out = super().run(batch, kv)
        self.layer_inputs = []
        if self.hp.softcap:
            soft_cap(out.logits, self.hp.softcap)
        return out

    def embed(self, tokens: Any) -> Any:
        x = super().embed(tokens)
        self.backend.scale_inplace(x, float(np.sqrt(np.float32(self.hp.n_embd))))
        if self.per_layer_inputs is not None:
            self.layer_inputs = self.per_layer_inputs(tokens, x)
        return x

    def attention_block(self, il: int, layer: Gemma4Layer, x: Any, batch: Batch, kv: KVCache) -> None:
        (o,) = layer.attn_out(self.attention(il, layer, self.norm(x, layer.attn_norm), batch, kv))
        self.backend.add_inplace(x, self.norm(o, layer.post_attn_norm))

    def attention(self, il: int, layer: Gemma4Layer, h: Any, batch: Batch, kv: KVCache) -> Any:
        """Project, norm, rotate, store (layers with their own cells) and attend: [T, n_head * head_dim]."""
        be, n, head_dim = self.backend, h.shape[0], layer.head_dim
        projected = layer.qkv(h)
        q = projected[0].reshape(n, self.hp.n_head, head_dim)
        self.head_norm(q, layer.q_norm)
        rope = self.rope_for(il)
        rope.apply(be, q, batch.positions, kv.n_ctx)
        k_cells, v_cells = self.cells(kv, il)
        if layer.has_kv:
            k, v = self.keys_values(layer, projected[1:], n)
            rope.apply(be, k, batch.positions, kv.n_ctx)
            be.store_kv(k, v, batch.seq_ids, batch.positions, k_cells, v_cells)
        out = be.empty(q.shape)
        be.attention(q, k_cells, v_cells, batch.seq_ids, batch.positions, self.window(il), 1.0, out)
        return out.reshape(n, self.hp.n_head * head_dim)

    def keys_values(self, layer: Gemma4Layer, kv_rows: list[Any], n: int) -> tuple[Any, Any]:
        """Normed K [n, kv heads, head_dim] (before RoPE) and V: RMS-normed without a weight, from its
        own projection or (no `attn_v`) from K's before K's norm."""
        shape = (n, layer.n_kv, layer.head_dim)
        k = kv_rows[0].reshape(shape)
        v = self.backend.empty(shape)
        flat = (n * layer.n_kv, layer.head_dim)
        source = kv_rows[-1].reshape(flat)  # attn_v's rows, or K's when there is no attn_v
        self.backend.rmsnorm(source, self.ones[layer.head_dim], self.hp.rms_eps, v.reshape(flat))
        self.head_norm(k, layer.k_norm)
        return k, v

    def ffn_block(self, layer: Gemma4Layer, x: Any) -> None:
        """The FFN (and experts) with their norms, then the per-layer input and the output scale."""
        be = self.backend
        gate, up = layer.gate_up(self.norm(x, layer.ffn_norm))
        be.gelu_mul(gate, up, gate)
        (y,) = layer.down(gate)
        if layer.experts is not None:
            y = self.norm(y, layer.post_ffn_norm_1)
            moe = layer.experts.run(self.norm(x, layer.pre_ffn_norm_2), x)
            be.add_inplace(y, self.norm(moe, layer.post_ffn_norm_2))
        be.add_inplace(x, self.norm(y, layer.post_ffn_norm))
        if layer.per_layer is not None:
            self.add_per_layer_input(layer, x)
        if layer.out_scale is not None:
            be.scale_inplace(x, layer.out_scale)

    def add_per_layer_input(self, layer: Gemma4Layer, x: Any) -> None:
        """x += norm(proj(GELU(inp_gate x) * this layer's input))."""
        assert layer.per_layer is not None
        gate, proj, post_norm = layer.per_layer
        (g,) = gate(x)
        self.backend.gelu_mul(g, self.layer_inputs[layer.il], g)
        (p,) = proj(g)
        self.backend.add_inplace(x, self.norm(p, post_norm))


def soft_cap(logits: np.ndarray, cap: float) -> None:
    """logits = cap * tanh(logits / cap) in place, in float32 as ggml's scale, tanh, scale."""
    logits *= np.float32(1.0) / np.float32(cap)
    np.tanh(logits, out=logits)
    logits *= np.float32(cap)
